"""Strategic discovery (ADR-038 §3.2): overlap, spectral cluster boost, determinism."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pml_planner.discovery import (
    MAX_CLUSTERS,
    STRUCTURAL_BOOST,
    StrategicDiscovery,
    cluster_count,
    kmeans,
    spectral_clusters,
)

# A file-system family and a git family; `mixed` mostly uses git but reads one file.
CAPABILITIES = {
    "fs_backup": ["fs:read", "fs:write"],
    "fs_index": ["fs:list", "fs:read"],
    "fs_sync": ["fs:read", "fs:write", "fs:list"],
    "git_release": ["git:status", "git:commit", "git:push"],
    "git_save": ["git:status", "git:commit"],
    "mixed": ["fs:read", "git:status", "git:commit", "git:push"],
}
FS = ["fs:read", "fs:write", "fs:list"]
GIT = ["git:status", "git:commit", "git:push"]


@pytest.fixture
def discovery() -> StrategicDiscovery:
    return StrategicDiscovery.build(CAPABILITIES, version="g1")


def test_boost_is_that_of_adr_038() -> None:
    assert STRUCTURAL_BOOST == 0.5


def test_clusters_follow_the_two_families(discovery: StrategicDiscovery) -> None:
    clusters = discovery.clusters
    assert clusters.k == 2  # round(√(12 nodes / 2)) = 2
    tool, cap = clusters.tool_cluster, clusters.capability_cluster
    assert len({tool[t] for t in FS}) == 1 and len({tool[t] for t in GIT}) == 1
    assert tool["fs:read"] != tool["git:status"]
    assert cap["fs_backup"] == cap["fs_index"] == cap["fs_sync"] == tool["fs:read"]
    assert cap["git_release"] == cap["git_save"] == cap["mixed"] == tool["git:status"]


def test_overlap_is_the_share_of_the_capabilitys_tools_in_context(
    discovery: StrategicDiscovery,
) -> None:
    context = ["fs:read"]
    assert discovery.score("fs_backup", context).overlap == pytest.approx(1 / 2)
    assert discovery.score("fs_sync", context).overlap == pytest.approx(1 / 3)
    assert discovery.score("mixed", context).overlap == pytest.approx(1 / 4)
    assert discovery.score("git_save", context).overlap == 0.0
    assert discovery.score("unknown", context).score == 0.0


def test_capabilities_of_the_active_cluster_get_the_boost(discovery: StrategicDiscovery) -> None:
    context = ["fs:read", "fs:write"]
    ranked = dict(discovery.rank_capabilities(context, k=10))
    assert ranked == pytest.approx(
        {
            "fs_backup": 1.0 * 1.5,
            "fs_sync": 2 / 3 * 1.5,
            "fs_index": 1 / 2 * 1.5,
            "mixed": 1 / 4,  # overlaps, but in the git cluster: no boost
        }
    )
    assert "git_save" not in ranked and "git_release" not in ranked  # no overlap, no score
    assert discovery.score("mixed", context).boost == 0.0
    assert discovery.score("fs_backup", context).boost == STRUCTURAL_BOOST


def test_boost_breaks_an_overlap_tie(discovery: StrategicDiscovery) -> None:
    # Two fs tools against one git tool: the fs cluster is the active one.
    context = ["fs:read", "fs:write", "git:status"]
    index, save = discovery.score("fs_index", context), discovery.score("git_save", context)
    assert index.overlap == save.overlap == 0.5
    assert (index.score, save.score) == pytest.approx((0.75, 0.5))
    order = [c for c, _ in discovery.rank_capabilities(context, k=10)]
    assert order.index("fs_index") < order.index("git_save")


def test_a_tie_between_clusters_makes_both_active(discovery: StrategicDiscovery) -> None:
    assert len(discovery.active_clusters(["fs:read", "git:push"])) == 2
    assert discovery.active_clusters(["not:a-member"]) == frozenset()
    assert discovery.rank_capabilities(["not:a-member"]) == []


def test_ranking_is_sorted_truncated_and_ties_go_by_id(discovery: StrategicDiscovery) -> None:
    ranked = discovery.rank_capabilities(["git:status", "git:commit", "git:push"], k=2)
    assert ranked == [("git_release", 1.5), ("git_save", 1.5)]
    with pytest.raises(ValueError, match="k must be at least 1"):
        discovery.rank_capabilities(["fs:read"], k=0)


def test_capabilities_without_tools_are_left_out() -> None:
    d = StrategicDiscovery.build({"empty": [], **CAPABILITIES})
    assert "empty" not in d.members
    assert d.score("empty", ["fs:read"]).score == 0.0
    assert StrategicDiscovery.build({}).rank_capabilities(["fs:read"]) == []


def test_clustering_is_deterministic_whatever_the_input_order() -> None:
    items = list(CAPABILITIES.items())
    random.Random(5).shuffle(items)
    shuffled = {cap: list(reversed(tools)) for cap, tools in items}
    one, two = spectral_clusters(CAPABILITIES), spectral_clusters(shuffled)
    assert one == two
    assert StrategicDiscovery.build(shuffled).rank_capabilities(["fs:read", "git:push"]) == (
        StrategicDiscovery.build(CAPABILITIES).rank_capabilities(["fs:read", "git:push"])
    )


def test_planted_groups_are_recovered() -> None:
    # Three groups of 8 tools, each with 6 capabilities drawn from its own group, plus a few
    # cross-group capabilities as noise.
    rng = random.Random(11)
    groups = [[f"g{g}:t{i}" for i in range(8)] for g in range(3)]
    caps: dict[str, list[str]] = {}
    for g, tools in enumerate(groups):
        for j in range(6):
            caps[f"g{g}:c{j}"] = rng.sample(tools, 3)
    caps["noise0"] = [groups[0][0], groups[1][0]]
    caps["noise1"] = [groups[1][1], groups[2][1]]
    clusters = spectral_clusters(caps, n_clusters=3)
    labels = [
        {clusters.tool_cluster[t] for t in tools if t in clusters.tool_cluster} for tools in groups
    ]
    assert all(len(group) == 1 for group in labels)
    assert len(set.union(*labels)) == 3
    for g in range(3):
        assert {clusters.capability_cluster[f"g{g}:c{j}"] for j in range(6)} == labels[g]


def test_disconnected_families_never_share_a_cluster() -> None:
    # Five unrelated pairs: the size rule alone would give round(√(20/2)) = 3 clusters.
    caps = {f"c{i}": [f"s{i}:a", f"s{i}:b"] for i in range(5)}
    caps |= {f"d{i}": [f"s{i}:a"] for i in range(5)}
    clusters = spectral_clusters(caps)
    assert clusters.k == 5
    assert len({clusters.capability_cluster[f"c{i}"] for i in range(5)}) == 5


def test_cluster_count_rule() -> None:
    assert cluster_count(3, 3) == 2  # √3 rounds to 2
    assert cluster_count(1, 1) == 1
    assert cluster_count(1000, 200) == 24  # √600
    assert cluster_count(10_000, 5_000) == MAX_CLUSTERS
    assert cluster_count(100, 60, components=40) == 40  # components win over the size rule
    assert cluster_count(100, 3, components=40) == 3  # never above the rank
    d = StrategicDiscovery.build(CAPABILITIES, n_clusters=1)
    assert d.clusters.k == 1  # every capability in the active cluster
    assert dict(d.rank_capabilities(["fs:read"]))["mixed"] == pytest.approx(0.25 * 1.5)


def test_kmeans_is_seeded_and_labels_by_first_appearance() -> None:
    points = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0], [0.0, 0.1]])
    labels = kmeans(points, 2)
    assert labels.tolist() == [0, 0, 1, 1, 0]
    assert kmeans(points, 2).tolist() == labels.tolist()
    assert kmeans(points, 9).tolist() == [0, 1, 2, 3, 4]


def test_singular_vectors_are_the_smallest_eigenvectors_of_the_normalised_laplacian() -> None:
    from pml_planner.discovery import _top_singular_vectors

    rng = np.random.default_rng(2)
    incidence = (rng.random((9, 5)) < 0.4).astype(float)
    incidence[incidence.sum(1) == 0, 0] = 1.0
    incidence[0, incidence.sum(0) == 0] = 1.0
    b = incidence / np.sqrt(incidence.sum(1))[:, None] / np.sqrt(incidence.sum(0))[None, :]
    adjacency = np.block([[np.zeros((9, 9)), incidence], [incidence.T, np.zeros((5, 5))]])
    d = adjacency.sum(1)
    laplacian = np.eye(14) - adjacency / np.sqrt(np.outer(d, d))
    u, v = _top_singular_vectors(b, 3)
    sigma = np.linalg.svd(b, compute_uv=False)[:3]
    smallest = np.linalg.eigvalsh(laplacian)[:3]
    assert 1 - sigma == pytest.approx(smallest)
    for i in range(3):
        z = np.concatenate([u[:, i], v[:, i]])
        assert laplacian @ z == pytest.approx((1 - sigma[i]) * z, abs=1e-9)
