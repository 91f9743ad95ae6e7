"""The tool/capability hierarchy SHGAT propagates over (seed 000, `computeHierarchyLevels`).

Tools are the vertices V; every capability is a hyperedge over its direct members, which may be
tools and other capabilities. A capability's level is 0 when it contains no capability, else one
more than its highest child capability (a topological sort). Incidence is kept per level and
without transitive closure: a level-k capability is linked to its direct children only.

Nodes live in one index space: tools first (0 … n_tools-1), then capabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


class CapabilityLike(Protocol):
    """What the hierarchy needs of a capability (`CapabilityInput`, or a graph reader's row)."""

    @property
    def id(self) -> str: ...
    @property
    def embedding(self) -> Sequence[float] | NDArray[np.floating] | None: ...
    @property
    def tools(self) -> Sequence[str]: ...
    @property
    def capabilities(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class CapabilityInput:
    """One capability as the graph declares it; `embedding` None means "from its children"."""

    id: str
    embedding: Sequence[float] | NDArray[np.floating] | None
    tools: Sequence[str] = ()
    capabilities: Sequence[str] = ()


@dataclass(frozen=True)
class LevelIncidence:
    """Direct memberships of the capabilities of one level.

    `child[e]` and `parent[e]` are node indices of edge e; `parents` / `children` are the
    distinct ends, and `parent_slot[e]` / `child_slot[e]` index edge ends into them, so that
    segment operations over edges stay dense.
    """

    child: IntArray
    parent: IntArray
    parents: IntArray
    children: IntArray
    parent_slot: IntArray
    child_slot: IntArray


@dataclass(frozen=True)
class Hierarchy:
    tool_ids: tuple[str, ...]
    capability_ids: tuple[str, ...]
    #: Row-normalised input embeddings of every node (tools, then capabilities).
    features: FloatArray
    #: Level of every capability (same order as `capability_ids`).
    capability_levels: IntArray
    #: One incidence per level, level 0 first.
    levels: tuple[LevelIncidence, ...]
    #: Memberships left out because they named an unknown node or closed a cycle.
    dropped: tuple[tuple[str, str], ...] = ()
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_tools(self) -> int:
        return len(self.tool_ids)

    @property
    def num_capabilities(self) -> int:
        return len(self.capability_ids)

    @property
    def num_nodes(self) -> int:
        return len(self.tool_ids) + len(self.capability_ids)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def node_index(self, node_id: str) -> int | None:
        """Index of a tool, else of a capability, with that id (tools win, as in seed 000)."""
        return self._index.get(node_id)

    def is_tool(self, index: int) -> bool:
        return index < self.num_tools

    @staticmethod
    def build(
        tools: Mapping[str, Sequence[float] | NDArray[np.floating]],
        capabilities: Sequence[CapabilityLike],
        dim: int | None = None,
    ) -> Hierarchy:
        return _build(tools, capabilities, dim)


def normalise_rows(matrix: NDArray[np.floating]) -> FloatArray:
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return np.asarray(matrix / np.maximum(norms, 1e-12), dtype=np.float64)


def _build(
    tools: Mapping[str, Sequence[float] | NDArray[np.floating]],
    capabilities: Sequence[CapabilityLike],
    dim: int | None,
) -> Hierarchy:
    tool_ids = tuple(tools)
    by_id = {c.id: c for c in capabilities}
    cap_ids = tuple(by_id)
    n_tools = len(tool_ids)
    cap_row = {cid: n_tools + i for i, cid in enumerate(cap_ids)}
    index: dict[str, int] = {**cap_row, **{tid: i for i, tid in enumerate(tool_ids)}}
    dropped: list[tuple[str, str]] = []
    known_tools = set(tool_ids)
    tool_children: dict[str, list[str]] = {}
    for cid in cap_ids:
        tool_children[cid] = [t for t in dict.fromkeys(by_id[cid].tools) if t in known_tools]
        dropped += [(cid, t) for t in by_id[cid].tools if t not in known_tools]
    cap_children = _acyclic_children(cap_ids, by_id, dropped)
    order = _topological_order(cap_ids, cap_children)
    levels = _levels(order, cap_children)
    width = dim if dim is not None else _infer_dim(tools, capabilities)
    features = np.zeros((n_tools + len(cap_ids), width), dtype=np.float64)
    if tool_ids:
        features[:n_tools] = normalise_rows(
            np.asarray([np.asarray(tools[t], dtype=np.float64) for t in tool_ids])
        )
    for cid in order:  # children first, so a capability without text can average them
        own = by_id[cid].embedding
        if own is not None:
            vector = np.asarray(own, dtype=np.float64)
        else:
            rows = [index[t] for t in tool_children[cid]] + [cap_row[c] for c in cap_children[cid]]
            vector = features[rows].mean(axis=0) if rows else np.zeros(width)
        features[cap_row[cid]] = normalise_rows(vector[None, :])[0]
    return Hierarchy(
        tool_ids=tool_ids,
        capability_ids=cap_ids,
        features=features,
        capability_levels=np.asarray([levels[c] for c in cap_ids], dtype=np.int64),
        levels=_incidences(cap_ids, index, cap_row, tool_children, cap_children, levels),
        dropped=tuple(dropped),
        _index=index,
    )


def _infer_dim(
    tools: Mapping[str, Sequence[float] | NDArray[np.floating]],
    capabilities: Sequence[CapabilityLike],
) -> int:
    for vector in [*tools.values(), *(c.embedding for c in capabilities)]:
        if vector is not None:
            return len(vector)
    raise ValueError("cannot infer the embedding size: no node has an embedding")


def _acyclic_children(
    cap_ids: tuple[str, ...], by_id: Mapping[str, CapabilityLike], dropped: list[tuple[str, str]]
) -> dict[str, list[str]]:
    """Child capabilities of each capability, minus unknown ones and those that close a cycle.

    A depth-first walk in declaration order drops every membership that points back to a
    capability on the current walk, so the result is a DAG and the choice is deterministic.
    The walk keeps its own stack: real hierarchies may be deeper than Python's recursion limit.
    """
    children: dict[str, list[str]] = {cid: [] for cid in cap_ids}
    state: dict[str, int] = {}  # 1 = on the walk, 2 = done
    for root in cap_ids:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(dict.fromkeys(by_id[root].capabilities)))]
        while stack:
            cid, pending = stack[-1]
            child = next(pending, None)
            if child is None:
                state[cid] = 2
                stack.pop()
            elif child not in by_id or state.get(child) == 1:
                dropped.append((cid, child))
            else:
                children[cid].append(child)
                if child not in state:
                    state[child] = 1
                    stack.append((child, iter(dict.fromkeys(by_id[child].capabilities))))
    return children


def _topological_order(
    cap_ids: tuple[str, ...], cap_children: Mapping[str, list[str]]
) -> list[str]:
    """Children before parents (post-order of a walk over the acyclic memberships)."""
    order: list[str] = []
    seen: set[str] = set()
    for root in cap_ids:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(cap_children[root]))]
        while stack:
            cid, pending = stack[-1]
            child = next(pending, None)
            if child is None:
                order.append(cid)
                stack.pop()
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(cap_children[child])))
    return order


def _levels(order: list[str], cap_children: Mapping[str, list[str]]) -> dict[str, int]:
    levels: dict[str, int] = {}
    for cid in order:
        below = [levels[c] for c in cap_children[cid]]
        levels[cid] = 1 + max(below) if below else 0
    return levels


def _incidences(
    cap_ids: tuple[str, ...],
    index: Mapping[str, int],
    cap_row: Mapping[str, int],
    tool_children: Mapping[str, list[str]],
    cap_children: Mapping[str, list[str]],
    levels: Mapping[str, int],
) -> tuple[LevelIncidence, ...]:
    count = 1 + max(levels.values()) if levels else 0
    edges: list[list[tuple[int, int]]] = [[] for _ in range(count)]
    for cid in cap_ids:
        parent = cap_row[cid]
        members = [index[t] for t in tool_children[cid]] + [cap_row[c] for c in cap_children[cid]]
        edges[levels[cid]] += [(child, parent) for child in members]
    return tuple(_incidence(level_edges) for level_edges in edges)


def _incidence(edges: list[tuple[int, int]]) -> LevelIncidence:
    pairs = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    child, parent = pairs[:, 0], pairs[:, 1]
    parents, parent_slot = np.unique(parent, return_inverse=True)
    children, child_slot = np.unique(child, return_inverse=True)
    return LevelIncidence(
        child=child,
        parent=parent,
        parents=parents.astype(np.int64),
        children=children.astype(np.int64),
        parent_slot=parent_slot.astype(np.int64),
        child_slot=child_slot.astype(np.int64),
    )
