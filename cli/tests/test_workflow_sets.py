import json
from collections import Counter
from pathlib import Path

import pytest

from pml_cli.catalog_files import load_catalog
from pml_cli.eval_tools import EvalError, load_queries
from pml_cli.workflow_sets import (
    MAX_INTENTS,
    MIN_INTENTS,
    WORKFLOWS,
    sequences_from_relevant,
    write_synthetic_workflows,
)

METATOOL = Path(__file__).resolve().parents[3] / "shared" / "data" / "tools-metatool"


def test_synthetic_set_is_valid_exchange_format(tmp_path: Path) -> None:
    summary = write_synthetic_workflows(tmp_path, seed=3)
    tools = load_catalog(tmp_path / "catalog.jsonl")
    queries = load_queries(tmp_path / "queries.jsonl")
    ids = {t.id for t in tools}
    assert summary["tools"] == len(tools) and 55 <= len(tools) <= 65
    assert len({t.server for t in tools}) >= 5
    assert all(t.description and t.id == f"{t.server}:{t.name}" for t in tools)
    assert summary["workflows"] == len(WORKFLOWS) and 20 <= len(WORKFLOWS) <= 30
    assert summary["queries"] == len(queries)
    for q in queries:
        assert q.sequence and 2 <= len(q.sequence) <= 5
        assert len(set(q.sequence)) == len(q.sequence)
        assert set(q.sequence) <= ids
        assert q.relevant == q.sequence
    per_workflow = Counter(q.id.rsplit("-", 1)[0] for q in queries)
    assert set(per_workflow) == {w.id for w in WORKFLOWS}
    assert all(MIN_INTENTS <= n <= MAX_INTENTS for n in per_workflow.values())
    assert len({q.query for q in queries}) == len(queries)  # no intent is ambiguous
    for row in (tmp_path / "queries.jsonl").read_text().splitlines():
        assert set(json.loads(row)) == {"id", "query", "relevant", "sequence"}


def test_synthetic_workflows_share_nest_and_branch() -> None:
    steps = [w.steps for w in WORKFLOWS]
    uses = Counter(t for s in steps for t in s)
    assert sum(1 for n in uses.values() if n >= 2) >= 10  # shared tools
    nested = [
        (a, b) for a in steps for b in steps if a != b and len(a) < len(b) and b[: len(a)] == a
    ]
    assert nested  # e.g. commit ⊂ commit and push
    goals = Counter(w.goal for w in WORKFLOWS)
    alternatives = [g for g, n in goals.items() if n >= 2]
    assert len(alternatives) >= 2
    for goal in alternatives:
        routes = {w.steps for w in WORKFLOWS if w.goal == goal}
        assert len(routes) >= 2


def test_synthetic_set_is_deterministic(tmp_path: Path) -> None:
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        write_synthetic_workflows(tmp_path / name, seed=seed)
    read = {n: (tmp_path / n / "queries.jsonl").read_bytes() for n in "abc"}
    assert read["a"] == read["b"]
    assert read["a"] != read["c"]
    catalogs = {(tmp_path / n / "catalog.jsonl").read_bytes() for n in "abc"}
    assert len(catalogs) == 1


def _write_set(folder: Path, queries: list[dict]) -> None:
    folder.mkdir()
    tools = [
        {"id": f"s:{n}", "server": "s", "name": n, "description": f"tool {n}", "input_schema": None}
        for n in "abc"
    ]
    (folder / "catalog.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))


def test_sequences_from_relevant_keeps_multi_tool_queries(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write_set(
        src,
        [
            {"id": "single-1", "query": "one", "relevant": ["s:a"]},
            {"id": "multi-1", "query": "two", "relevant": ["s:c", "s:a"]},
            {"id": "multi-2", "query": "dup", "relevant": ["s:b", "s:b"]},
        ],
    )
    summary = sequences_from_relevant(src, tmp_path / "out")
    queries = load_queries(tmp_path / "out" / "queries.jsonl")
    assert [(q.id, q.sequence) for q in queries] == [("multi-1", ["s:c", "s:a"])]
    assert summary["queries"] == 1 and summary["of"] == 3
    assert summary["sequence_from"] == "relevant"
    assert "co-usage" in summary["note"]
    assert (tmp_path / "out" / "catalog.jsonl").read_bytes() == (src / "catalog.jsonl").read_bytes()


def test_sequences_from_relevant_refuses_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write_set(src, [{"id": "single-1", "query": "one", "relevant": ["s:a"]}])
    with pytest.raises(EvalError, match="no query with 2"):
        sequences_from_relevant(src, tmp_path / "out")
    with pytest.raises(EvalError, match="different folders"):
        sequences_from_relevant(src, src)
    with pytest.raises(EvalError, match="cannot read"):
        sequences_from_relevant(tmp_path / "missing", tmp_path / "out2")


@pytest.mark.skipif(not METATOOL.is_dir(), reason="no shared tools-metatool set here")
def test_sequences_from_metatool(tmp_path: Path) -> None:
    summary = sequences_from_relevant(METATOOL, tmp_path)
    queries = load_queries(tmp_path / "queries.jsonl")
    assert summary["queries"] == len(queries) > 0
    assert all(q.id.startswith("multi-") and len(q.sequence or []) >= 2 for q in queries)
