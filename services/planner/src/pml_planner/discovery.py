"""Strategic discovery (ADR-038 §3.2): capabilities suggested by what the agent is doing now.

    discoveryScore(cap) = ToolsOverlap(cap) × (1 + StructuralBoost(cap))

- ToolsOverlap: the share of the capability's distinct tools that are in the context.
- StructuralBoost: `STRUCTURAL_BOOST` (0.5, ADR-038 §4.2) when the capability is in an active
  spectral cluster, else 0. The active clusters are those holding the most context tools (the
  majority vote of the reference implementation; on a tie every tied cluster is active rather
  than an arbitrary one). Context tools that belong to no capability have no cluster.

Scores lie in [0, 1.5]. A capability with no tool in the context scores 0 and is not suggested.

Spectral clustering of the bipartite tool–capability graph (tools on one side, capabilities on
the other, an edge per membership), as Ng–Jordan–Weiss on its normalised Laplacian
L = I − D^{-1/2} A D^{-1/2}. For a bipartite A = [[0, H], [Hᵀ, 0]] the eigenvectors of L with
the k smallest eigenvalues are [uᵢ; vᵢ] for the k largest singular triplets (σᵢ, uᵢ, vᵢ) of
B = D_t^{-1/2} H D_c^{-1/2} (eigenvalue 1 − σᵢ; Dhillon 2001), so the singular vectors of the
tools × capabilities matrix (from the eigenvectors of its smaller Gram matrix) replace an
eigen-decomposition of the (tools + capabilities)² Laplacian. Rows are normalised to unit
length, then k-means (k-means++ seeding, fixed seed, several restarts, the lowest inertia wins)
assigns a cluster to every tool and capability. Cost: a dense tools × capabilities matrix and
an eigen-decomposition of size min(tools, capabilities), once per graph version (about 1 s for
2400 member tools and 600 capabilities on two cores).

Number of clusters k: round(√(n/2)) for n nodes of the bipartite graph (the usual rule of
thumb), at most `MAX_CLUSTERS`, but never fewer than the graph's connected components (tools
that never share a capability should not share a cluster), and at most
min(#tools, #capabilities), the rank of B.

Determinism: the partition does not depend on the signs or the rotation LAPACK picks inside a
repeated singular value, because k-means++ and Lloyd only use distances, which are invariant
under both; the seed fixes the rest. Tools and capabilities are indexed in sorted order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from numpy.typing import NDArray

STRUCTURAL_BOOST = 0.5
MAX_CLUSTERS = 32
KMEANS_SEED = 38
KMEANS_RESTARTS = 8
KMEANS_MAX_ITER = 100

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class DiscoveryScore:
    capability: str
    score: float
    overlap: float
    boost: float


@dataclass(frozen=True)
class SpectralClusters:
    """Cluster of every tool and capability of the bipartite graph (labels 0..k−1)."""

    k: int
    tool_cluster: Mapping[str, int]
    capability_cluster: Mapping[str, int]


@dataclass(frozen=True)
class StrategicDiscovery:
    """Discovery over one version of a tenant's capabilities; build once per version."""

    #: Distinct member tools of every capability that has at least one.
    members: Mapping[str, frozenset[str]]
    clusters: SpectralClusters
    version: str = ""

    @classmethod
    def build(
        cls,
        capabilities: Mapping[str, Iterable[str]],
        *,
        n_clusters: int | None = None,
        version: str = "",
    ) -> StrategicDiscovery:
        """From each capability's member tools (`{cap.id: cap.tools}` of `ToolGraph`).

        Capabilities without tools are left out: they have no overlap to score. `n_clusters`
        overrides the size rule (tests, experiments).
        """
        members = {cap: tools for cap, m in capabilities.items() if (tools := frozenset(m))}
        return cls(members, spectral_clusters(members, n_clusters), version)

    def active_clusters(self, context_tools: Iterable[str]) -> frozenset[int]:
        counts: dict[int, int] = {}
        for tool in set(context_tools):
            cluster = self.clusters.tool_cluster.get(tool)
            if cluster is not None:
                counts[cluster] = counts.get(cluster, 0) + 1
        if not counts:
            return frozenset()
        most = max(counts.values())
        return frozenset(c for c, n in counts.items() if n == most)

    def score(self, capability: str, context_tools: Iterable[str]) -> DiscoveryScore:
        context = set(context_tools)
        return self._score(capability, context, self.active_clusters(context))

    def rank_capabilities(
        self, context_tools: Iterable[str], k: int = 10
    ) -> list[tuple[str, float]]:
        """The k best capabilities for the context, best first, ties by id; zero scores omitted.

        `score` gives the terms of one capability's score.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        context = set(context_tools)
        active = self.active_clusters(context)
        scored = [self._score(cap, context, active) for cap in self.members]
        scored = [s for s in scored if s.score > 0]
        scored.sort(key=lambda s: (-s.score, s.capability))
        return [(s.capability, s.score) for s in scored[:k]]

    def _score(self, capability: str, context: set[str], active: frozenset[int]) -> DiscoveryScore:
        tools = self.members.get(capability)
        if not tools:
            return DiscoveryScore(capability, 0.0, 0.0, 0.0)
        overlap = len(tools & context) / len(tools)
        in_active = self.clusters.capability_cluster.get(capability) in active
        boost = STRUCTURAL_BOOST if in_active else 0.0
        return DiscoveryScore(capability, overlap * (1.0 + boost), overlap, boost)


# --- spectral clustering --------------------------------------------------------------------


def spectral_clusters(
    members: Mapping[str, Iterable[str]], n_clusters: int | None = None
) -> SpectralClusters:
    """Clusters of the bipartite tool–capability graph (see the module docstring)."""
    memberships = {cap: sorted(set(tools)) for cap, tools in members.items()}
    caps = sorted(cap for cap, tools in memberships.items() if tools)
    tools = sorted({t for cap in caps for t in memberships[cap]})
    if not caps:
        return SpectralClusters(0, {}, {})
    tool_index = {t: i for i, t in enumerate(tools)}
    incidence = np.zeros((len(tools), len(caps)))
    for j, cap in enumerate(caps):
        incidence[[tool_index[t] for t in memberships[cap]], j] = 1.0

    components = _components(tools, caps, memberships)
    k = n_clusters if n_clusters is not None else cluster_count(len(tools), len(caps), components)
    k = max(1, min(k, len(tools), len(caps)))

    d_tools = incidence.sum(axis=1)
    d_caps = incidence.sum(axis=0)
    b = incidence / np.sqrt(d_tools)[:, None] / np.sqrt(d_caps)[None, :]
    u, v = _top_singular_vectors(b, k)
    embedding = np.vstack([u, v])
    norms = np.linalg.norm(embedding, axis=1, keepdims=True)
    embedding = embedding / np.maximum(norms, 1e-12)

    labels = kmeans(embedding, k)
    return SpectralClusters(
        k=int(labels.max()) + 1,
        tool_cluster={t: int(labels[i]) for i, t in enumerate(tools)},
        capability_cluster={c: int(labels[len(tools) + j]) for j, c in enumerate(caps)},
    )


def _top_singular_vectors(b: FloatArray, k: int) -> tuple[FloatArray, FloatArray]:
    """Left and right singular vectors of the k largest singular values of `b`.

    Through the eigen-decomposition of the smaller Gram matrix (BᵀB or BBᵀ) rather than a full
    SVD: the same vectors, an order of magnitude faster with LAPACK's SVD on a small machine
    (2400 × 600: 0.4 s against 11 s on two cores), and accurate enough for clustering since
    only the leading singular values are used. A direction with σ ≈ 0 (possible only when k
    exceeds the rank, e.g. capabilities with identical tools) gets zero vectors.
    """
    transpose = b.shape[0] < b.shape[1]
    m = b.T if transpose else b
    eigenvalues, eigenvectors = np.linalg.eigh(m.T @ m)
    order = np.argsort(eigenvalues)[::-1][:k]
    sigma = np.sqrt(np.maximum(eigenvalues[order], 0.0))
    right = eigenvectors[:, order]
    safe = np.where(sigma > 1e-9, sigma, np.inf)
    left = (m @ right) / safe[None, :]
    return (right, left) if transpose else (left, right)


def cluster_count(n_tools: int, n_capabilities: int, components: int = 1) -> int:
    """k from the graph's size: round(√(n/2)) capped at MAX_CLUSTERS, ≥ components, ≤ rank."""
    by_size = min(round(math.sqrt((n_tools + n_capabilities) / 2)), MAX_CLUSTERS)
    return max(1, min(max(by_size, components), n_tools, n_capabilities))


def _components(
    tools: Sequence[str], caps: Sequence[str], members: Mapping[str, Sequence[str]]
) -> int:
    graph = nx.Graph()
    graph.add_nodes_from(("tool", t) for t in tools)
    graph.add_nodes_from(("cap", c) for c in caps)
    graph.add_edges_from((("cap", c), ("tool", t)) for c in caps for t in members[c])
    return int(nx.number_connected_components(graph))


def kmeans(points: FloatArray, k: int, seed: int = KMEANS_SEED) -> IntArray:
    """Lloyd's k-means with k-means++ seeding; labels renumbered by first appearance.

    `KMEANS_RESTARTS` seedings from one generator; the lowest inertia wins (the first on a
    tie), so the result depends only on the points, k and the seed.
    """
    n = points.shape[0]
    if k >= n:
        return _first_appearance(np.arange(n, dtype=np.int64))
    rng = np.random.default_rng(seed)
    best_labels, best_inertia = _lloyd(points, _plus_plus(points, k, rng))
    for _ in range(KMEANS_RESTARTS - 1):
        labels, inertia = _lloyd(points, _plus_plus(points, k, rng))
        if inertia < best_inertia - 1e-12:
            best_labels, best_inertia = labels, inertia
    return _first_appearance(best_labels)


def _sq_distances(points: FloatArray, centres: FloatArray) -> FloatArray:
    d = (points**2).sum(1)[:, None] - 2.0 * points @ centres.T + (centres**2).sum(1)[None, :]
    return np.asarray(np.maximum(d, 0.0), dtype=np.float64)


def _plus_plus(points: FloatArray, k: int, rng: np.random.Generator) -> FloatArray:
    centres = [points[rng.integers(points.shape[0])]]
    closest = _sq_distances(points, np.asarray(centres))[:, 0]
    for _ in range(1, k):
        total = closest.sum()
        if total <= 0:  # fewer distinct points than k: repeat one, Lloyd keeps it empty
            centres.append(centres[-1])
            continue
        pick = int(rng.choice(points.shape[0], p=closest / total))
        centres.append(points[pick])
        closest = np.minimum(closest, _sq_distances(points, points[pick][None, :])[:, 0])
    return np.asarray(centres)


def _lloyd(points: FloatArray, centres: FloatArray) -> tuple[IntArray, float]:
    labels = np.zeros(points.shape[0], dtype=np.int64)
    for _ in range(KMEANS_MAX_ITER):
        distances = _sq_distances(points, centres)
        labels = distances.argmin(axis=1).astype(np.int64)
        k = centres.shape[0]
        counts = np.bincount(labels, minlength=k)
        sums = np.zeros_like(centres)
        np.add.at(sums, labels, points)
        # An empty cluster keeps its centre (it may win points back on the next pass).
        moved = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centres)
        if np.allclose(moved, centres, atol=1e-10):
            break
        centres = moved
    distances = _sq_distances(points, centres)
    labels = distances.argmin(axis=1).astype(np.int64)
    return labels, float(distances[np.arange(points.shape[0]), labels].sum())


def _first_appearance(labels: IntArray) -> IntArray:
    mapping: dict[int, int] = {}
    for label in labels.tolist():
        mapping.setdefault(label, len(mapping))
    return np.asarray([mapping[label] for label in labels.tolist()], dtype=np.int64)
