"""`pml eval make-variant`: a set's tools described, or its requests put, otherwise."""

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
    queries = [
        {"id": "q1", "query": "will it rain", "relevant": ["weather:forecast"]},
        {"id": "q2", "query": "today's headlines", "relevant": ["news:headlines"]},
    ]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    meta = [{"id": "q1", "level": 1}, {"id": "q2", "level": 1}]
    (folder / "query_meta.jsonl").write_text("".join(json.dumps(m) + "\n" for m in meta))
    return folder


def _make_variant(
    src: Path, descriptions: Path, out: Path, option: str = "--descriptions"
) -> Result:
    arguments = ["--from", str(src), option, str(descriptions), "--out", str(out)]
    return runner.invoke(app, ["eval", "make-variant", *arguments])


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_variant_replaces_the_descriptions_it_names_and_keeps_the_rest(tmp_path: Path) -> None:
    src = _set(tmp_path / "src")
    descriptions = tmp_path / "zh.json"
    descriptions.write_text(json.dumps({"weather:forecast": "天气预报"}, ensure_ascii=False))
    result = _make_variant(src, descriptions, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "redescribed: 1" in result.stdout
    rows = _rows(tmp_path / "out" / "catalog.jsonl")
    assert [r["description"] for r in rows] == ["天气预报", "News"]
    assert (tmp_path / "out" / "queries.jsonl").read_text() == (src / "queries.jsonl").read_text()


def test_a_variant_naming_an_unknown_tool_or_no_object_is_refused(tmp_path: Path) -> None:
    src = _set(tmp_path / "src")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"mail:send": "发送邮件"}))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(["not", "an", "object"]))
    for bad, message in ((unknown, "not tool ids of the set"), (listed, "must be an object")):
        result = _make_variant(src, bad, tmp_path / "out")
        assert result.exit_code == 1 and message in " ".join(result.stderr.split())
    result = _make_variant(src, unknown, tmp_path / "out", option="--queries")
    assert result.exit_code == 1 and "not query ids of the set" in " ".join(result.stderr.split())
    result = runner.invoke(app, ["eval", "make-variant", "--from", str(src), "--out", "x"])
    assert result.exit_code == 1 and "--descriptions, --queries" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_variant_of_requests_holds_the_reworded_queries_only(tmp_path: Path) -> None:
    src = _set(tmp_path / "src")
    requests = tmp_path / "zh.json"
    requests.write_text(json.dumps({"q2": "今天的头条新闻"}, ensure_ascii=False))
    result = _make_variant(src, requests, tmp_path / "out", option="--queries")
    assert result.exit_code == 0, result.output
    assert "reworded: 1" in result.stdout and "queries: 1" in result.stdout
    out = tmp_path / "out"
    assert _rows(out / "queries.jsonl") == [
        {"id": "q2", "query": "今天的头条新闻", "relevant": ["news:headlines"]}
    ]
    assert _rows(out / "query_meta.jsonl") == [{"id": "q2", "level": 1}]
    assert _rows(out / "catalog.jsonl") == _rows(src / "catalog.jsonl")


def test_the_probes_in_the_docs_name_tools_of_metatool() -> None:
    """The translations docs/benchmarks.md measures with: two disjoint sets of 40 MetaTool
    tools and 40 ETOM tools, all of MetaTool's; 70 ETOM and 42 + 41 MetaTool requests."""
    probes = Path(__file__).parents[2] / "docs" / "probes"
    a = json.loads((probes / "metatool-descriptions-zh-a.json").read_text(encoding="utf-8"))
    b = json.loads((probes / "metatool-descriptions-zh-b.json").read_text(encoding="utf-8"))
    assert len(a) == len(b) == 40 and not set(a) & set(b)
    etom = json.loads((probes / "etom-descriptions-zh.json").read_text(encoding="utf-8"))
    assert len(etom) == 40 and all(":" in tool for tool in etom)
    requests = json.loads((probes / "etom-queries-zh.json").read_text(encoding="utf-8"))
    assert sum(q.startswith("etom-L3-") for q in requests) == 40
    assert sum(q.startswith("etom-L4-") for q in requests) == 30
    requests = json.loads((probes / "metatool-queries-zh.json").read_text(encoding="utf-8"))
    assert sorted(requests) == sorted(f"multi-{i}" for i in range(0, 497, 12))
    again = json.loads((probes / "metatool-queries-zh-2.json").read_text(encoding="utf-8"))
    assert sorted(again) == sorted(f"multi-{i}" for i in range(6, 497, 12))
    whole = json.loads((probes / "metatool-descriptions-zh-all.json").read_text(encoding="utf-8"))
    assert len(whole) == 199 and set(a) | set(b) < set(whole)
