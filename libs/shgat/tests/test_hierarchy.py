from __future__ import annotations

import numpy as np
import pytest

from pml_shgat.hierarchy import CapabilityInput, Hierarchy
from pml_shgat.params import MAX_PARAMETER_LEVELS, init_params, make_config, num_levels
from pml_shgat.serving import ServingModel


def _tools(*ids: str, dim: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t: rng.standard_normal(dim) for t in ids}


def test_levels_follow_a_topological_sort() -> None:
    h = Hierarchy.build(
        _tools("s:a", "s:b", "s:c"),
        [
            CapabilityInput("top", None, tools=["s:c"], capabilities=["mid"]),
            CapabilityInput("mid", None, capabilities=["leaf"]),
            CapabilityInput("leaf", None, tools=["s:a", "s:b"]),
        ],
    )
    levels = dict(zip(h.capability_ids, h.capability_levels.tolist(), strict=True))
    assert levels == {"top": 2, "mid": 1, "leaf": 0}
    assert h.num_levels == 3


def test_incidence_has_direct_members_only() -> None:
    h = Hierarchy.build(
        _tools("s:a", "s:b"),
        [
            CapabilityInput("leaf", None, tools=["s:a"]),
            CapabilityInput("top", None, tools=["s:b"], capabilities=["leaf"]),
        ],
    )
    top = h.node_index("top")
    leaf = h.node_index("leaf")
    level1 = h.levels[1]
    children_of_top = set(level1.child[level1.parent == top].tolist())
    # no transitive closure: s:a reaches `top` only through `leaf`
    assert children_of_top == {h.node_index("s:b"), leaf}
    assert set(h.levels[0].child.tolist()) == {h.node_index("s:a")}


def test_cycles_and_unknown_members_are_dropped_and_reported() -> None:
    h = Hierarchy.build(
        _tools("s:a"),
        [
            CapabilityInput("x", None, tools=["s:a", "s:ghost"], capabilities=["y"]),
            CapabilityInput("y", None, capabilities=["x", "nowhere"]),
        ],
    )
    assert ("x", "s:ghost") in h.dropped
    assert ("y", "nowhere") in h.dropped
    assert ("y", "x") in h.dropped  # closes the cycle x -> y -> x
    assert sorted(h.capability_levels.tolist()) == [0, 1]


def test_capability_without_text_averages_its_children() -> None:
    tools = {"s:a": np.array([1.0, 0, 0]), "s:b": np.array([0, 1.0, 0])}
    h = Hierarchy.build(tools, [CapabilityInput("c", None, tools=["s:a", "s:b"])])
    row = h.features[h.node_index("c")]
    np.testing.assert_allclose(row, np.array([1, 1, 0]) / np.sqrt(2))


def test_a_tool_wins_over_a_capability_of_the_same_id() -> None:
    h = Hierarchy.build(_tools("s:a"), [CapabilityInput("s:a", None, tools=["s:a"])])
    assert h.node_index("s:a") == 0
    assert h.is_tool(0)


def test_dimension_must_be_known() -> None:
    with pytest.raises(ValueError, match="embedding size"):
        Hierarchy.build({}, [CapabilityInput("c", None)])


def test_a_chain_deeper_than_the_recursion_limit_is_levelled() -> None:
    depth = 5000
    caps = [CapabilityInput("c0", None, tools=["s:a"])] + [
        CapabilityInput(f"c{i}", None, capabilities=[f"c{i - 1}"]) for i in range(1, depth)
    ]
    h = Hierarchy.build(_tools("s:a", dim=16), list(reversed(caps)))
    assert h.num_levels == depth
    assert int(h.capability_levels[h.capability_ids.index("c4999")]) == depth - 1
    config = make_config(16, 16, h.num_nodes)
    params = init_params(config, h.features, h.num_levels)
    assert num_levels(params) == MAX_PARAMETER_LEVELS  # deeper levels share the last ones
    assert len(ServingModel(config, params, h).score_capabilities(np.ones(16), 3)) == 3
