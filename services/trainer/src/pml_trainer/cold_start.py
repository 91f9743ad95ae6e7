"""Cold start of the tool graph (seed 004): edges guessed before any execution is observed.

Three sources of guesses, all weaker than anything an execution shows:

- workflow templates (YAML): `sequence` edges with `source=template` (weight 0.5 × 0.5);
- description similarity: `sequence` edges with `source=inferred`, `origin=similarity`, weight
  scaled by the cosine, between tools whose description embeddings have a cosine of at least
  `similarity_threshold`, the `similarity_k` most similar per tool;
- same server: `sequence` edges with `source=inferred`, `origin=same_server`, weight halved, from
  each tool to its `same_server_k` most similar tools of the same server (no threshold: being on
  the same server is the evidence; the similarity only picks which ones, capping the fan-out).

Similarity is symmetric, so similarity and same-server guesses are written in both directions.
Cold start plans edges for the tools of one `ToolsRegistered` event against the tenant's
catalog; the store merges them with `statistics.merge_cold_start` (never over evidence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np
import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pml_common.graph_statistics import EdgeKey, EdgeState, merge_cold_start
from pml_common.input_rules import is_tool_id

log = structlog.get_logger(__name__)

#: Cosine from which two descriptions count as similar. Calibrated on the default embedder
#: (multilingual-e5-small, whose cosines are compressed): tools of unrelated servers score
#: 0.82–0.89, tools of one family (read/list/write file; git status/diff/add) 0.90–0.95.
#: Embedders with a wider spread (e.g. BGE-M3) want a lower value, around 0.75.
SIMILARITY_THRESHOLD = 0.90
SIMILARITY_K = 5
SAME_SERVER_K = 3
#: Same-server edges weigh half an ordinary inferred edge (seed 004: "weakly connected").
SAME_SERVER_FACTOR = 0.5
#: Rows of the similarity matrix computed at once, bounding memory to block × catalog floats.
_BLOCK = 256

ColdStartEdge = tuple[EdgeKey, EdgeState]


class PassageEmbedder(Protocol):
    """The part of `pml_common.embedding.Embedder` cold start uses."""

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class CatalogTool:
    id: str
    server: str
    name: str
    description: str = ""

    def text(self) -> str:
        return f"{self.name}. {self.description}".strip()


@dataclass(frozen=True)
class ColdStartConfig:
    similarity_threshold: float = SIMILARITY_THRESHOLD
    similarity_k: int = SIMILARITY_K
    same_server_k: int = SAME_SERVER_K


@dataclass
class ColdStartPlan:
    edges: list[ColdStartEdge] = field(default_factory=list)
    template_edges: int = 0
    templates_skipped: int = 0
    similarity_edges: int = 0
    same_server_edges: int = 0


# --- workflow templates ----------------------------------------------------------------------


class Template(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    edges: tuple[tuple[str, str], ...] = Field(min_length=1)

    @field_validator("edges")
    @classmethod
    def _tool_ids(cls, edges: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for a, b in edges:
            for tool in (a, b):
                if not is_tool_id(tool):
                    raise ValueError(f"{tool!r} is not a tool id of the form server:tool")
        return edges


class TemplateError(ValueError):
    """The templates file cannot be used; the message names the file and the problem."""


def bundled_templates() -> Path:
    return Path(str(resources.files("pml_trainer") / "workflow_templates.yaml"))


def load_templates(path: str | Path | None = None) -> list[Template]:
    """Templates of `path`, or of the bundled file when `path` is empty."""
    source = Path(path) if path else bundled_templates()
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"cannot read workflow templates {source}: {exc}") from exc
    entries = data.get("templates") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise TemplateError(f"{source}: expected a mapping under `templates:`")
    try:
        return [Template(name=name, **(body or {})) for name, body in entries.items()]
    except (TypeError, ValidationError) as exc:
        raise TemplateError(f"{source}: invalid template: {exc}") from exc


def template_edges(
    templates: Sequence[Template], catalog: set[str], new_ids: set[str]
) -> tuple[list[ColdStartEdge], int]:
    """Template edges touching a newly registered tool, and how many were skipped.

    Skipped: edges touching a new tool whose other end is not in the catalog (yet); they are
    applied by the registration that brings the missing tool.
    """
    edges: list[ColdStartEdge] = []
    skipped = 0
    state = EdgeState(source="template", origin="template", count=0)
    for template in templates:
        for a, b in template.edges:
            if a not in new_ids and b not in new_ids:
                continue
            if a in catalog and b in catalog:
                edges.append((EdgeKey(a, b, "sequence"), state))
            else:
                skipped += 1
    return edges, skipped


# --- similarity and same-server edges --------------------------------------------------------


def similarity_edges(
    tools: Sequence[CatalogTool],
    vectors: np.ndarray,
    new_rows: Sequence[int],
    config: ColdStartConfig,
) -> tuple[list[ColdStartEdge], list[ColdStartEdge]]:
    """(similarity edges, same-server edges) of the tools at `new_rows` against all `tools`.

    `vectors` are the L2-normalised description embeddings of `tools`, row for row.
    """
    servers = np.array([t.server for t in tools])
    similar: list[ColdStartEdge] = []
    same_server: list[ColdStartEdge] = []
    for start in range(0, len(new_rows), _BLOCK):
        rows = np.asarray(new_rows[start : start + _BLOCK], dtype=np.int64)
        sims = vectors[rows] @ vectors.T
        sims[np.arange(len(rows)), rows] = -np.inf  # a tool is not its own neighbour
        for i, row in enumerate(rows):
            scores = sims[i]
            eligible = np.flatnonzero(scores >= config.similarity_threshold)
            for j in _top_k(scores, eligible, config.similarity_k):
                similar.extend(_both_ways(tools, row, j, "similarity", float(scores[j])))
            peers = np.flatnonzero((servers == servers[row]) & np.isfinite(scores))
            for j in _top_k(scores, peers, config.same_server_k):
                same_server.extend(_both_ways(tools, row, j, "same_server", SAME_SERVER_FACTOR))
    return similar, same_server


def _top_k(scores: np.ndarray, candidates: np.ndarray, k: int) -> list[int]:
    if k <= 0 or candidates.size == 0:
        return []
    if candidates.size > k:
        part = np.argpartition(-scores[candidates], k - 1)[:k]
        candidates = candidates[part]
    # Ties broken by row so that the same catalog always yields the same edges.
    order = sorted(candidates.tolist(), key=lambda j: (-float(scores[j]), j))
    return order


def _both_ways(
    tools: Sequence[CatalogTool], i: int, j: int, origin: str, factor: float
) -> list[ColdStartEdge]:
    state = EdgeState(source="inferred", origin=origin, count=0, factor=factor)  # type: ignore[arg-type]
    a, b = tools[i].id, tools[j].id
    return [(EdgeKey(a, b, "sequence"), state), (EdgeKey(b, a, "sequence"), state)]


# --- the plan ----------------------------------------------------------------------------------


async def plan_cold_start(
    new_tools: Sequence[CatalogTool],
    catalog: Sequence[CatalogTool],
    embedder: PassageEmbedder,
    templates: Sequence[Template],
    config: ColdStartConfig | None = None,
) -> ColdStartPlan:
    """Edges to guess for `new_tools`, given the tenant's `catalog` (new tools included)."""
    config = config or ColdStartConfig()
    tools = _merge_catalog(catalog, new_tools)
    new_ids = {t.id for t in new_tools}
    plan = ColdStartPlan()
    from_templates, plan.templates_skipped = template_edges(
        templates, {t.id for t in tools}, new_ids
    )
    vectors = await embedder.embed_passages([t.text() for t in tools])
    new_rows = [i for i, t in enumerate(tools) if t.id in new_ids]
    similar, same_server = similarity_edges(tools, vectors, new_rows, config)
    plan.template_edges, plan.similarity_edges = len(from_templates), len(similar)
    plan.same_server_edges = len(same_server)
    plan.edges = combine([*from_templates, *similar, *same_server])
    return plan


def _merge_catalog(
    catalog: Sequence[CatalogTool], new_tools: Sequence[CatalogTool]
) -> list[CatalogTool]:
    # The event's version of a tool wins: its description is the one being registered now.
    merged = {t.id: t for t in catalog}
    merged.update({t.id: t for t in new_tools})
    return list(merged.values())


def combine(edges: Sequence[ColdStartEdge]) -> list[ColdStartEdge]:
    """One guess per edge key: the heaviest, by the same rule the store applies."""
    best: dict[EdgeKey, EdgeState] = {}
    for key, state in edges:
        merged = merge_cold_start(best.get(key), state)
        if merged is not None:
            best[key] = merged
    return list(best.items())
