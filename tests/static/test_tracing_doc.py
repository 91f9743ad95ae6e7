"""The "Tracing" section of docs/operations.md names exactly the spans and `pml.*` attributes the
code creates, so the documentation cannot drift from the code.

Span names come from every `start_as_current_span(...)`/`start_span(...)` of libs/, services/ and
cli/: a literal stays as it is, the variable parts of an f-string (and a name computed at run
time) become `<…>`, as the documentation writes them. Names beginning with `/` are the gRPC
method spans made by OpenTelemetry's instrumentation, not by PML code. Attributes are the dotted
keys (`pml.*`, `messaging.*`, `db.*`, …) given to `set_attribute(...)` or written in a
dictionary: each must be documented, and each documented `pml.*` attribute must be set somewhere
(the others named in the section also include those of OpenTelemetry's gRPC instrumentation).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_GLOBS = ("libs/*/src/**/*.py", "services/*/src/**/*.py", "cli/src/**/*.py")
DOC = ROOT / "docs" / "operations.md"
SPAN_FACTORIES = {"start_as_current_span", "start_span"}
PML_ATTRIBUTE = re.compile(r"(?<![\w/.])pml\.[a-z_]+(?:\.[a-z_]+)*(?![\w])")
ATTRIBUTE_KEY = re.compile(r"[a-z_]+(?:\.[a-z_]+)+")
PLACEHOLDER = re.compile(r"<[^>]*>")


def _sources() -> list[Path]:
    return sorted({p for pattern in SOURCE_GLOBS for p in ROOT.glob(pattern)})


def _span_name(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "<>"
            for v in node.values
        )
    return "<>"


def _normalized(name: str) -> str:
    return PLACEHOLDER.sub("<>", name)


def code_span_names() -> dict[str, str]:
    """Normalized span name -> where the code creates it."""
    names: dict[str, str] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in SPAN_FACTORIES
            ):
                continue
            arg = (
                node.args[0]
                if node.args
                else next(k.value for k in node.keywords if k.arg == "name")
            )
            names[_normalized(_span_name(arg))] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return names


def code_attributes() -> set[str]:
    keys: set[str] = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            candidates: list[ast.expr | None] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "set_attribute" and node.args:
                    candidates.append(node.args[0])
            elif isinstance(node, ast.Dict):
                candidates.extend(node.keys)
            for key in candidates:
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(key.value, str)
                    and ATTRIBUTE_KEY.fullmatch(key.value)
                ):
                    keys.add(key.value)
    return keys


def tracing_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Tracing\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def documented_span_names() -> set[str]:
    """First cells of the span table ("span name | kind | made by | attributes")."""
    section = tracing_section()
    table = section[section.index("| span name |") :].split("\n\n", 1)[0]
    names = set()
    for row in table.splitlines()[2:]:
        cell = row.split("|")[1].strip()
        assert cell.startswith("`") and cell.endswith("`"), f"not a span name: {cell!r}"
        names.add(_normalized(cell.strip("`")))
    return names


def test_documented_span_names_are_the_ones_the_code_creates() -> None:
    documented = {n for n in documented_span_names() if not n.startswith("/")}
    created = code_span_names()
    undocumented = {n: where for n, where in created.items() if n not in documented}
    assert not undocumented, f"spans missing from docs/operations.md#tracing: {undocumented}"
    assert documented <= set(created), (
        f"documented spans no code creates: {sorted(documented - set(created))}"
    )


def test_every_attribute_the_code_sets_is_documented() -> None:
    section = tracing_section()
    created = code_attributes()
    assert created, "no attribute found in the code: the scan is broken"
    undocumented = {k for k in created if not re.search(rf"`{re.escape(k)}[`=]", section)}
    assert not undocumented, f"attributes missing from docs/operations.md#tracing: {undocumented}"


def test_every_documented_pml_attribute_is_set_by_the_code() -> None:
    documented = set(PML_ATTRIBUTE.findall(tracing_section()))
    unknown = documented - code_attributes()
    assert not unknown, f"documented pml.* attributes no code sets: {sorted(unknown)}"


def test_the_scan_reads_literals_f_strings_and_computed_names() -> None:
    names = code_span_names()
    assert "ingest.chunking" in names  # a literal
    assert "publish <>" in names and "ingest.<>" in names  # f-strings
    assert "<>" in names  # the Neo4j spans, named from the query at run time
    keys = code_attributes()
    assert {"pml.tenant_id", "pml.event.type", "messaging.system", "db.namespace"} <= keys
