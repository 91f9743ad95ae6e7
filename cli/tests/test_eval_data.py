"""`pml eval make-variant`: a set's tools described otherwise, its queries unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from pml_cli.main import app

runner = CliRunner()


def _set(folder: Path) -> Path:
    folder.mkdir()
    tools = [
        {"id": "weather:forecast", "server": "weather", "name": "forecast", "description": "Rain"},
        {"id": "news:headlines", "server": "news", "name": "headlines", "description": "News"},
    ]
    (folder / "catalog.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
    query = {"id": "q1", "query": "will it rain", "relevant": ["weather:forecast"]}
    (folder / "queries.jsonl").write_text(json.dumps(query) + "\n")
    return folder


def _make_variant(src: Path, descriptions: Path, out: Path) -> Result:
    arguments = ["--from", str(src), "--descriptions", str(descriptions), "--out", str(out)]
    return runner.invoke(app, ["eval", "make-variant", *arguments])


def test_a_variant_replaces_the_descriptions_it_names_and_keeps_the_rest(tmp_path: Path) -> None:
    src = _set(tmp_path / "src")
    descriptions = tmp_path / "zh.json"
    descriptions.write_text(json.dumps({"weather:forecast": "天气预报"}, ensure_ascii=False))
    result = _make_variant(src, descriptions, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "redescribed: 1" in result.stdout
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "catalog.jsonl").read_text().splitlines()
    ]
    assert [r["description"] for r in rows] == ["天气预报", "News"]
    assert (tmp_path / "out" / "queries.jsonl").read_text() == (src / "queries.jsonl").read_text()


def test_a_variant_naming_an_unknown_tool_or_no_object_is_refused(tmp_path: Path) -> None:
    src = _set(tmp_path / "src")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"mail:send": "发送邮件"}))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(["not", "an", "object"]))
    for bad, message in ((unknown, "not tools of"), (listed, "must be an object")):
        result = _make_variant(src, bad, tmp_path / "out")
        assert result.exit_code == 1 and message in " ".join(result.stderr.split())
    assert not (tmp_path / "out").exists()


def test_the_probes_in_the_docs_name_tools_of_metatool() -> None:
    """The translations docs/benchmarks.md measures with: two disjoint sets of 40 MetaTool
    tools, and 40 ETOM tools."""
    probes = Path(__file__).parents[2] / "docs" / "probes"
    a = json.loads((probes / "metatool-descriptions-zh-a.json").read_text(encoding="utf-8"))
    b = json.loads((probes / "metatool-descriptions-zh-b.json").read_text(encoding="utf-8"))
    assert len(a) == len(b) == 40 and not set(a) & set(b)
    etom = json.loads((probes / "etom-descriptions-zh.json").read_text(encoding="utf-8"))
    assert len(etom) == 40 and all(":" in tool for tool in etom)
