"""Cold start without I/O: templates, similarity and same-server guesses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pml_common.graph_statistics import EdgeKey, EdgeState
from pml_trainer.cold_start import (
    CatalogTool,
    ColdStartConfig,
    TemplateError,
    load_templates,
    plan_cold_start,
    similarity_edges,
    template_edges,
)

#: Seed 004, "Bootstrap du graphe avec templates", verbatim.
SEED_004 = {
    "web_research": [
        ("tavily:tavily-search", "memory:create_entities"),
        ("exa:search", "memory:create_entities"),
        ("tavily:tavily-extract", "filesystem:write_file"),
    ],
    "browser_automation": [
        ("playwright:playwright_navigate", "playwright:playwright_screenshot"),
        ("playwright:playwright_navigate", "playwright:playwright_click"),
        ("playwright:playwright_click", "playwright:playwright_fill"),
        ("playwright:playwright_screenshot", "filesystem:write_file"),
    ],
    "file_operations": [
        ("filesystem:read_file", "filesystem:write_file"),
        ("filesystem:list_directory", "filesystem:read_file"),
        ("filesystem:read_multiple_files", "filesystem:write_file"),
    ],
    "knowledge_management": [
        ("memory:create_entities", "memory:search_nodes"),
        ("memory:add_observations", "memory:search_nodes"),
        ("memory:search_nodes", "memory:open_nodes"),
    ],
}


def tool(tool_id: str, description: str = "") -> CatalogTool:
    server, _, name = tool_id.partition(":")
    return CatalogTool(tool_id, server, name, description)


def test_bundled_templates_hold_seed_004_exactly_plus_git_and_fetch() -> None:
    templates = {t.name: list(t.edges) for t in load_templates()}
    for name, edges in SEED_004.items():
        assert templates[name] == edges
    all_edges = {e for edges in templates.values() for e in edges}
    assert ("git:git_add", "git:git_commit") in all_edges
    assert ("fetch:fetch", "filesystem:write_file") in all_edges


def test_templates_path_overrides_and_bad_files_are_reported(tmp_path: Path) -> None:
    own = tmp_path / "t.yaml"
    own.write_text("templates:\n  mine:\n    edges:\n      - [a:x, b:y]\n")
    assert [(t.name, t.edges) for t in load_templates(str(own))] == [("mine", (("a:x", "b:y"),))]
    bad = tmp_path / "bad.yaml"
    bad.write_text("templates:\n  mine:\n    edges:\n      - [not-a-tool, b:y]\n")
    with pytest.raises(TemplateError, match="not-a-tool"):
        load_templates(bad)
    with pytest.raises(TemplateError, match="cannot read"):
        load_templates(tmp_path / "missing.yaml")


def test_template_edges_need_both_tools_and_touch_a_new_one() -> None:
    templates = load_templates()
    catalog = {"filesystem:read_file", "filesystem:write_file", "filesystem:list_directory"}
    edges, skipped = template_edges(templates, catalog, new_ids={"filesystem:read_file"})
    assert {k for k, _ in edges} == {
        EdgeKey("filesystem:read_file", "filesystem:write_file", "sequence"),
        EdgeKey("filesystem:list_directory", "filesystem:read_file", "sequence"),
    }
    assert all(s == EdgeState("template", "template", 0) for _, s in edges)
    # read_file also appears with search_files, directory_tree and edit_file, absent here.
    assert skipped == 3
    assert template_edges(templates, catalog, new_ids=set()) == ([], 0)


def unit(*rows: Sequence[float]) -> np.ndarray:
    v = np.asarray(rows, dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_similarity_edges_respect_threshold_and_go_both_ways() -> None:
    tools = [tool("a:x"), tool("b:y"), tool("c:z")]
    vectors = unit([1, 0], [0.95, 0.312], [0, 1])  # cos(x, y) ≈ 0.95, cos(x, z) = 0
    config = ColdStartConfig(similarity_threshold=0.9, similarity_k=5, same_server_k=3)
    similar, same_server = similarity_edges(tools, vectors, [0], config)
    assert {k for k, _ in similar} == {
        EdgeKey("a:x", "b:y", "sequence"),
        EdgeKey("b:y", "a:x", "sequence"),
    }
    state = similar[0][1]
    assert (state.source, state.origin) == ("inferred", "similarity")
    assert state.factor == pytest.approx(float(vectors[0] @ vectors[1]))
    assert same_server == []  # every tool is on its own server


def test_same_server_fan_out_is_capped_at_k() -> None:
    rng = np.random.default_rng(7)
    tools = [tool(f"big:t{i}") for i in range(100)] + [tool("other:o")]
    vectors = unit(*rng.normal(size=(101, 16)))
    config = ColdStartConfig(similarity_threshold=1.1, similarity_k=5, same_server_k=3)
    similar, same_server = similarity_edges(tools, vectors, list(range(101)), config)
    assert similar == []  # nothing reaches a cosine of 1.1
    for key, state in same_server:
        assert key.src.startswith("big:") and key.dst.startswith("big:")
        assert (state.origin, state.factor) == ("same_server", 0.5)
    # 3 chosen per tool, plus the mirrored edges of the tools that chose it: far below 100².
    assert len({k for k, _ in same_server}) <= 100 * 3 * 2
    picks = {
        t.id: {k.dst for k, _ in same_server[i * 6 : i * 6 + 6 : 2]}
        for i, t in enumerate(tools[:100])
    }
    assert all(len(p) == 3 for p in picks.values())


def test_same_server_picks_the_most_similar_peers() -> None:
    tools = [tool("s:a"), tool("s:b"), tool("s:c"), tool("s:d")]
    vectors = unit([1, 0, 0], [0.9, 0.1, 0], [0.5, 0.5, 0], [0, 0, 1])
    config = ColdStartConfig(similarity_threshold=2.0, similarity_k=0, same_server_k=2)
    _, same_server = similarity_edges(tools, vectors, [0], config)
    assert {k.dst for k, _ in same_server if k.src == "s:a"} == {"s:b", "s:c"}


class TableEmbedder:
    """Vectors from a fixed table: the real embedder's contract, with chosen geometry."""

    def __init__(self, table: dict[str, Sequence[float]]) -> None:
        self.table = table
        self.calls: list[list[str]] = []

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return unit(*(self.table[t] for t in texts))


async def test_plan_combines_sources_and_keeps_the_heaviest_guess() -> None:
    read = tool("filesystem:read_file", "read")
    write = tool("filesystem:write_file", "write")
    other = tool("weather:forecast", "weather")
    embedder = TableEmbedder(
        {read.text(): [1, 0], write.text(): [0.96, 0.28], other.text(): [0, 1]}
    )
    plan = await plan_cold_start([read], [write, other], embedder, load_templates())
    edges = dict(plan.edges)
    forward = edges[EdgeKey("filesystem:read_file", "filesystem:write_file", "sequence")]
    # template (0.5) < similarity (0.7 × 0.96): the heavier guess wins.
    assert (forward.source, forward.origin) == ("inferred", "similarity")
    assert EdgeKey("filesystem:read_file", "weather:forecast", "sequence") not in edges
    assert plan.template_edges == 1 and plan.similarity_edges == 2 and plan.same_server_edges == 2
