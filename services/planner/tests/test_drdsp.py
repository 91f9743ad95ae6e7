"""DR-DSP: incremental trees against from-scratch Dijkstra, and where hyperpaths beat tool paths."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pml_planner.drdsp import DRDSP, DagEdge, dependency_dag, shortest_path_tree
from pml_planner.hypergraph import (
    Hyperedge,
    Hypergraph,
    capability_cost,
    capability_hyperedge,
    link_hyperedge,
)

# --- reference: brute-force reduction + a textbook Dijkstra ----------------------------------


def brute_force_arcs(graph: Hypergraph) -> dict[tuple[str, str], float]:
    arcs: dict[tuple[str, str], float] = {}
    for edge in graph.edges():
        for u in edge.tail:
            for v in edge.head:
                if u != v:
                    arcs[u, v] = min(edge.cost, arcs.get((u, v), edge.cost))
    return arcs


def reference_tree(
    arcs: dict[tuple[str, str], float], root: str
) -> tuple[dict[str, float], dict[str, str]]:
    """O(V²) Dijkstra, then each parent by definition: the smallest tight in-neighbour."""
    adjacency: dict[str, dict[str, float]] = defaultdict(dict)
    for (u, v), w in arcs.items():
        adjacency[u][v] = w
    dist = {root: 0.0}
    done: set[str] = set()
    while open_ := [(d, v) for v, d in dist.items() if v not in done]:
        d, x = min(open_)
        done.add(x)
        for y, w in adjacency[x].items():
            if y not in dist or d + w < dist[y]:
                dist[y] = d + w
    parent = {}
    for v in dist:
        if v != root:
            tight = [u for u in dist if v in adjacency[u] and dist[u] + adjacency[u][v] == dist[v]]
            parent[v] = min(tight)
    return dist, parent


def check_against_scratch(planner: DRDSP) -> None:
    arcs = brute_force_arcs(planner.graph)
    for root in planner.kept_sources:
        tree = planner.peek(root)
        assert tree is not None and tree.live
        expected = reference_tree(arcs, root)
        assert (dict(tree.distance), dict(tree.parent)) == expected, root
        assert shortest_path_tree(planner.graph, root) == expected
    for source in planner.kept_sources:
        for target in sorted(planner.graph.vertices):
            check_path(planner, source, target)


def check_path(planner: DRDSP, source: str, target: str) -> None:
    path = planner.forward(source, target)
    reached = planner.peek(source)
    assert reached is not None
    if path is None:
        assert target not in reached.distance
        return
    graph = planner.graph
    assert path.vertices[0] == source and path.vertices[-1] == target
    assert len(path.hyperedges) == len(path.vertices) - 1
    weights = []
    for (u, v), edge_id in zip(
        zip(path.vertices, path.vertices[1:], strict=False), path.hyperedges, strict=True
    ):
        weight = graph.arc_weight(u, v)
        assert weight is not None, (u, v)
        edge = graph.edge(edge_id)
        assert u in edge.tail and v in edge.head and edge.cost == weight
        weights.append(weight)
    assert path.cost == sum(weights) == reached.distance[target]
    needed = set().union(*(graph.edge(e).tail for e in path.hyperedges)) - set(path.vertices)
    assert path.requires == tuple(sorted(needed))


# --- property: any sequence of changes -------------------------------------------------------

# Mostly a few round costs, so that equally short paths (and the id tie rule) are common.
_ROUND = st.sampled_from([0.5, 1.0, 1.0, 1.5, 2.0, 3.0])
COSTS = st.one_of(_ROUND, _ROUND, _ROUND, st.floats(0.1, 10.0))


Op = tuple[str, int, frozenset[str], frozenset[str], float, bool, str]

#: Adds outnumber removals, so that graphs grow enough for changes to cut through trees.
KINDS = ["add", "add", "add", "remove", "reweight", "reweight", "forward", "forward"]


def ops_strategy(vertices: str) -> st.SearchStrategy[Op]:
    """Random changes and queries. A hyperedge is picked by index among the live (or removed)
    ones at run time, so that every change applies whatever came before."""
    vertex = st.sampled_from(vertices)
    return st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, 1000),
        st.frozensets(vertex, min_size=1, max_size=3),  # tail
        st.frozensets(vertex, min_size=1, max_size=2),  # head
        COSTS,
        st.booleans(),  # re-use a removed id: its stale heap entries must stay dead
        vertex,  # root of a query
    )


def run_ops(planner: DRDSP, ops: list[Op]) -> None:
    live: list[str] = []
    removed: list[str] = []
    for kind, index, tail, head, cost, reuse, root in ops:
        if kind == "forward":
            planner.forward_tree(root)
        elif kind == "add":
            if reuse and removed:
                edge_id = removed.pop(index % len(removed))
            else:
                edge_id = f"e{len(live) + len(removed)}"
            live.append(edge_id)
            planner.add(Hyperedge(edge_id, tail, head, cost))
        elif not live:
            continue
        elif kind == "remove":
            edge_id = live.pop(index % len(live))
            removed.append(edge_id)
            planner.remove(edge_id)
        else:
            planner.reweight(live[index % len(live)], cost)
        check_against_scratch(planner)


@settings(max_examples=200, deadline=None)
@given(st.lists(ops_strategy("abcdefg"), min_size=10, max_size=50))
def test_incremental_trees_equal_scratch_after_any_changes(ops: list[Op]) -> None:
    # small LRUs so that eviction and re-building happen too
    run_ops(DRDSP(max_sources=3), ops)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from("abc"), min_size=1, max_size=3),
    st.lists(ops_strategy("abcdefghijkl"), min_size=30, max_size=80),
)
def test_incremental_trees_equal_scratch_on_larger_graphs(
    sources: list[str], ops: list[Op]
) -> None:
    # trees kept from the start, so that long sequences of repairs build up on them
    planner = DRDSP(max_sources=3)
    for source in sources:
        planner.forward_tree(source)
    run_ops(planner, ops)


def test_recompute_all_gives_the_same_trees() -> None:
    planner = DRDSP()
    for i, (tail, head, cost) in enumerate(
        [("ab", "c", 1.0), ("c", "d", 2.0), ("a", "d", 3.0), ("d", "e", 1.0), ("b", "e", 4.0)]
    ):
        planner.add(Hyperedge(f"e{i}", frozenset(tail), frozenset(head), cost))
    planner.forward_tree("a")
    planner.forward_tree("b")
    planner.reweight("e0", 5.0)
    planner.remove("e3")
    views = {root: planner.peek(root) for root in planner.kept_sources}
    before = {root: (dict(v.distance), dict(v.parent)) for root, v in views.items() if v}
    planner.recompute_all()
    # rebuilt in place: the views handed out before still read the live trees
    after = {root: (dict(v.distance), dict(v.parent)) for root, v in views.items() if v}
    assert before == after and len(after) == 2
    assert after["a"][0] == {"a": 0.0, "c": 5.0, "d": 3.0}  # d → e was removed
    assert after["b"][0] == {"b": 0.0, "c": 5.0, "d": 7.0, "e": 4.0}


# --- the planner's contract ------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used_tree() -> None:
    planner = DRDSP(
        Hypergraph([Hyperedge("e", frozenset("a"), frozenset("b"), 1.0)]), max_sources=2
    )
    first = planner.forward_tree("a")
    planner.forward_tree("b")
    planner.forward_tree("a")  # a is now the most recent
    planner.forward_tree("c")
    assert planner.kept_sources == ("a", "c")
    assert first.live and planner.peek("b") is None


def test_views_follow_changes_until_evicted() -> None:
    planner = DRDSP(max_sources=1)
    planner.add(Hyperedge("e1", frozenset("a"), frozenset("t"), 2.0))
    tree = planner.forward_tree("a")
    assert tree.distance == {"a": 0.0, "t": 2.0} and tree.parent["t"] == "a"
    planner.add(Hyperedge("e2", frozenset("t"), frozenset("b"), 1.0))
    assert tree.distance["b"] == 3.0 and tree.path("b") == ("a", "t", "b")
    planner.remove("e1")  # the subtree under t is cut off
    assert tree.distance == {"a": 0.0} and tree.path("b") is None
    planner.forward_tree("x")
    assert not tree.live


def test_a_change_behind_the_planners_back_is_refused_until_recomputed() -> None:
    planner = DRDSP()
    planner.add(Hyperedge("e1", frozenset("a"), frozenset("b"), 1.0))
    planner.forward_tree("a")
    planner.graph.reweight("e1", 2.0)
    with pytest.raises(RuntimeError):
        planner.forward("a", "b")
    with pytest.raises(RuntimeError):
        planner.add(Hyperedge("e2", frozenset("b"), frozenset("c"), 1.0))
    planner.recompute_all()
    path = planner.forward("a", "b")
    assert path is not None and path.cost == 2.0


def test_source_is_its_own_path_and_unknown_vertices_are_out_of_reach() -> None:
    planner = DRDSP(Hypergraph([Hyperedge("e", frozenset("a"), frozenset("b"), 1.0)]))
    path = planner.forward("a", "a")
    assert path is not None and path.vertices == ("a",) and path.cost == 0.0
    assert path.next_step is None
    assert planner.forward("a", "zz") is None
    assert planner.forward("zz", "a") is None
    assert dict(planner.forward_tree("zz").distance) == {"zz": 0.0}


def test_ties_go_to_the_smallest_vertex_id() -> None:
    # two equally cheap ways a → t: through m or through n; m < n
    graph = Hypergraph(
        [
            Hyperedge("1", frozenset("a"), frozenset("n"), 1.0),
            Hyperedge("2", frozenset("n"), frozenset("t"), 1.0),
            Hyperedge("3", frozenset("a"), frozenset("m"), 1.5),
            Hyperedge("4", frozenset("m"), frozenset("t"), 0.5),
        ]
    )
    planner = DRDSP(graph)
    path = planner.forward("a", "t")
    assert path is not None and path.vertices == ("a", "m", "t")
    planner.reweight("3", 1.75)
    path = planner.forward("a", "t")
    assert path is not None and path.vertices == ("a", "n", "t")


# --- hyperpaths vs plain paths on the tool graph --------------------------------------------


def legacy_tool_path(graph: Hypergraph, source: str, capability_members: set[str]) -> list[str]:
    """What the legacy planner did: Dijkstra on tool→tool links only (cost = 1 / weight), to
    the nearest tool of the target capability."""
    tools = nx.DiGraph()
    for edge in graph.edges():
        if edge.kind != "capability":
            (u,), (v,) = edge.tail, edge.head
            tools.add_edge(u, v, weight=edge.cost)
    dist, paths = nx.single_source_dijkstra(tools, source)
    nearest = min((d, v) for v, d in dist.items() if v in capability_members)[1]
    return list(paths[nearest])


def test_the_hyperpath_brings_the_member_a_tool_path_leaves_out() -> None:
    # a → b → c is the cheap, well-trodden chain, and c is a member of `export`; but `export`
    # only happens with c AND x (its hyperedge needs {c, x})
    edges = [
        link_hyperedge("a", "b", "sequence", "observed"),
        link_hyperedge("b", "c", "sequence", "observed"),
        link_hyperedge("x", "c", "dependency", "observed"),
        capability_hyperedge("export", ["c", "x"], 0.9),
    ]
    planner = DRDSP(Hypergraph(edges))
    legacy = legacy_tool_path(planner.graph, "a", {"c", "x"})
    assert legacy == ["a", "b", "c"]  # done, says the tool graph: x is nowhere

    path = planner.forward("a", "export")
    assert path is not None
    assert path.vertices == ("a", "b", "c", "export")
    assert path.hyperedges[-1] == "capability:export"
    assert path.requires == ("x",)  # the capability's hyperedge cannot fire without x
    assert path.cost == pytest.approx(2.0 + 2.0 + capability_cost(0.9))
    assert path.next_step == "b"

    dag = planner.dependency_dag("export")
    assert set(dag.nodes) == {"c", "x", "export"}
    assert set(dag.edges) == {
        DagEdge("c", "export", "member"),
        DagEdge("x", "export", "member"),
        DagEdge("x", "c", "order"),  # the dependency link puts x before c
    }
    assert dag.order == ("x", "c", "export")


def test_an_unreliable_capability_is_avoided_even_when_its_tool_is_nearer() -> None:
    # `report` can be had two ways: through c (nearer on the tool graph, but that capability
    # succeeds 20 % of the time) or through d (a bit farther, 95 % reliable)
    via_c = capability_hyperedge("report", ["c", "x"], 0.2, edge_id="report#via-c")
    via_d = capability_hyperedge("report", ["d"], 0.95, edge_id="report#via-d")
    edges = [
        link_hyperedge("a", "c", "sequence", "observed"),  # cost 2.0
        link_hyperedge("a", "d", "sequence", "inferred"),  # cost 2.86
        via_c,
        via_d,
    ]
    planner = DRDSP(Hypergraph(edges))
    assert legacy_tool_path(planner.graph, "a", {"c", "x", "d"}) == ["a", "c"]

    path = planner.forward("a", "report")
    assert path is not None and path.vertices == ("a", "d", "report")
    assert path.hyperedges == ("sequence:a->d", "report#via-d") and path.requires == ()
    dag = planner.dependency_dag("report")
    assert dag.hyperedges == {"report": "report#via-d"} and dag.order == ("d", "report")
    tree = planner.forward_tree("a")
    assert tree.path("report") == ("a", "d", "report")

    # the c capability becomes reliable: it is now the cheaper hyperedge, and both flip
    planner.reweight("report#via-c", capability_cost(0.99))
    path = planner.forward("a", "report")
    assert path is not None and path.vertices == ("a", "c", "report")
    assert path.requires == ("x",)
    dag = planner.dependency_dag("report")
    assert dag.hyperedges == {"report": "report#via-c"} and set(dag.nodes) == {"c", "x", "report"}
    # the view handed out before reads the repaired kept tree, equal to a from-scratch one
    assert tree.live and tree.path("report") == ("a", "c", "report")
    assert (dict(tree.distance), dict(tree.parent)) == shortest_path_tree(planner.graph, "a")

    # and back when it degrades again
    planner.reweight("report#via-c", capability_cost(0.3))
    path = planner.forward("a", "report")
    assert path is not None and path.vertices == ("a", "d", "report")
    assert planner.dependency_dag("report").hyperedges == {"report": "report#via-d"}


# --- dependency DAG --------------------------------------------------------------------------


def test_dependency_dag_expands_nested_capabilities() -> None:
    graph = Hypergraph(
        [
            capability_hyperedge("deploy", ["build", "t3"], 0.9),
            capability_hyperedge("build", ["t1", "t2"], 0.8),
            link_hyperedge("t1", "t2", "sequence", "observed"),
            link_hyperedge("t3", "t1", "sequence", "template"),  # not members of one capability
        ]
    )
    dag = dependency_dag(graph, "deploy")
    assert dag.nodes == ("build", "deploy", "t1", "t2", "t3")
    assert set(dag.edges) == {
        DagEdge("build", "deploy", "member"),
        DagEdge("t3", "deploy", "member"),
        DagEdge("t1", "build", "member"),
        DagEdge("t2", "build", "member"),
        DagEdge("t1", "t2", "order"),
    }
    assert dag.order == ("t1", "t2", "build", "t3", "deploy")
    assert dag.hyperedges == {"deploy": "capability:deploy", "build": "capability:build"}
    assert dag.cost == pytest.approx(capability_cost(0.9) + capability_cost(0.8))
    assert dag.dropped == ()
    assert_topological(dag.order, dag.edges)


def test_dependency_dag_does_not_loop_on_a_cycle_of_capabilities() -> None:
    graph = Hypergraph(
        [
            capability_hyperedge("A", ["t1", "B"], 0.9),
            capability_hyperedge("B", ["t2", "C"], 0.9),
            capability_hyperedge("C", ["t3", "A"], 0.9),
        ]
    )
    dag = dependency_dag(graph, "A")
    assert set(dag.nodes) == {"A", "B", "C", "t1", "t2", "t3"}
    assert dag.dropped == (DagEdge("A", "C", "member"),)
    assert dag.order[-1] == "A"
    assert_topological(dag.order, dag.edges)


def test_dependency_dag_keeps_the_cheaper_of_two_opposite_orders() -> None:
    graph = Hypergraph(
        [
            capability_hyperedge("cap", ["p", "q"], None),
            link_hyperedge("p", "q", "sequence", "template"),  # cost 4
            link_hyperedge("q", "p", "dependency", "observed"),  # cost 1
        ]
    )
    dag = dependency_dag(graph, "cap")
    assert DagEdge("q", "p", "order") in dag.edges and DagEdge("p", "q", "order") not in dag.edges
    assert dag.order == ("q", "p", "cap")


def test_dependency_dag_of_a_tool_or_unknown_vertex_is_itself() -> None:
    graph = Hypergraph([link_hyperedge("a", "b", "sequence", "observed")])
    for target in ("b", "nope"):
        dag = dependency_dag(graph, target)
        assert dag.nodes == dag.order == (target,) and dag.edges == () and dag.cost == 0


def assert_topological(order: tuple[str, ...], edges: tuple[DagEdge, ...]) -> None:
    position = {v: i for i, v in enumerate(order)}
    for edge in edges:
        assert position[edge.src] < position[edge.dst], edge
