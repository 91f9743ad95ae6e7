"""Execution memory (pml_shgat.memory): its features, leave-one-out reading, fit and storage."""

from __future__ import annotations

import numpy as np
import pytest

from pml_shgat.gating import Corrections, Judged, choose_weights, judge
from pml_shgat.memory import (
    FEATURES,
    TOP_K,
    Execution,
    Memory,
    fit,
)
from pml_shgat.params import from_bytes, init_params, make_config, read_version, to_bytes

DIM = 16
TOOLS = [f"t{i:02d}" for i in range(60)]
# Twelve servers of five tools: t00-t04 on s0, t05-t09 on s1, …
SERVERS = [f"s{i // 5}" for i in range(len(TOOLS))]


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=DIM)
    return v / np.linalg.norm(v)


def _executions(rng: np.random.Generator, n: int = 40) -> list[Execution]:
    """Work of one habit: a tool of server s0 is always run with its partner on server s1
    (t0i with t0(i+5)), whatever the intent says."""
    out = []
    for _ in range(n):
        a = int(rng.integers(0, 5))
        out.append(Execution(_unit(rng), (TOOLS[a], TOOLS[a + 5])))
    return out


def _first_stage(rng: np.random.Generator, leader: int, partner: int, rank: int) -> np.ndarray:
    """Random scores with `leader` first and `partner` at `rank` (1-based)."""
    scores = np.sort(rng.random(len(TOOLS)))[::-1].copy()
    order = [i for i in range(len(TOOLS)) if i not in (leader, partner)]
    rng.shuffle(order)
    order.insert(0, leader)
    order.insert(rank - 1, partner)
    out = np.empty(len(TOOLS))
    out[order] = scores
    return out


def test_reading_without_one_execution_is_the_memory_built_without_it() -> None:
    rng = np.random.default_rng(0)
    executions = _executions(rng)
    # a leader of server s0, which every execution used: each counts in every feature
    scores = _first_stage(rng, 2, 7, 9)
    whole = Memory(executions, TOOLS, SERVERS)
    # executions that ran the leader and its partner, each read with its own intent (as when
    # fitting): its own tools, co-use and vote must all be left out
    running = [i for i, e in enumerate(executions) if e.tools == ("t02", "t07")]
    assert len(running) >= 3
    for i in running:
        intent = executions[i].intent
        others = executions[:i] + executions[i + 1 :]
        cand, loo = whole.features(scores, intent, exclude=i)
        cand_without, without = Memory(others, TOOLS, SERVERS).features(scores, intent)
        assert np.array_equal(cand, cand_without)
        assert np.allclose(loo, without), FEATURES
        # and reading it whole differs: the execution's own tools count
        assert not np.allclose(whole.features(scores, intent)[1], loo)


def test_a_partner_always_run_with_the_leader_is_raised_into_the_top_five() -> None:
    rng = np.random.default_rng(1)
    executions = _executions(rng, 60)
    train = [
        _first_stage(rng, TOOLS.index(e.tools[0]), TOOLS.index(e.tools[1]), 8) for e in executions
    ]
    ranker = fit(executions, train, TOOLS, SERVERS)
    assert ranker is not None
    served = ranker.serve(TOOLS, SERVERS)
    # A new request: the leader t02 first, its partner t07 at rank 9, the intent unlike any seen.
    first = _first_stage(rng, 2, 7, 9)
    correction = served.correction(first, _unit(rng))
    assert np.all(correction[np.argsort(-first)[:TOP_K]] > 0)
    ranked = list(np.argsort(-(first + 4.0 * correction), kind="stable"))
    assert ranked.index(7) < 5 <= list(np.argsort(-first, kind="stable")).index(7)


def test_a_tool_the_nearest_intents_ran_is_a_candidate_wherever_the_first_stage_ranks_it() -> None:
    rng = np.random.default_rng(4)
    intent = _unit(rng)
    # one execution close to the request ran t59; the others ran tools of s0 and s1 only
    executions = [*_executions(rng), Execution(intent + 0.05 * _unit(rng), ("t00", "t59"))]
    memory = Memory(executions, TOOLS, SERVERS)
    scores = np.linspace(1.0, 0.0, len(TOOLS))  # t59 last, t50-t58 also outside the top TOP_K
    cand, rows = memory.features(scores, intent)
    assert list(cand) == [*range(TOP_K), TOOLS.index("t59")]
    assert rows[-1, FEATURES.index("neighbour_votes")] > 0
    # read without that execution (as when fitting on it), nothing votes for t59
    loo, _ = memory.features(scores, intent, exclude=len(executions) - 1)
    assert list(loo) == list(range(TOP_K))


def test_nothing_to_learn_gives_no_ranker() -> None:
    rng = np.random.default_rng(2)
    assert fit([], [], TOOLS, SERVERS) is None
    # executions whose tools all left the catalog
    gone = [Execution(_unit(rng), ("removed",)) for _ in range(5)]
    assert fit(gone, [rng.random(len(TOOLS)) for _ in gone], TOOLS, SERVERS) is None


def test_the_memory_travels_in_the_version_bytes_and_tools_gone_are_dropped() -> None:
    rng = np.random.default_rng(3)
    executions = _executions(rng)
    first = [rng.random(len(TOOLS)) for _ in executions]
    ranker = fit(executions, first, TOOLS, SERVERS)
    assert ranker is not None
    config = make_config(DIM, 8, len(TOOLS))
    params = init_params(config, np.eye(len(TOOLS), DIM), 0)
    blob = to_bytes(config, params, ranker.to_arrays())
    # the parameters read back as before, without the memory's arrays
    _, read = from_bytes(blob)
    assert sorted(read) == sorted(params)
    back = read_version(blob).memory
    assert back is not None and np.allclose(back.weights, ranker.weights)
    assert [e.tools for e in back.executions] == [e.tools for e in executions]
    scores, intent = rng.random(len(TOOLS)), _unit(rng)
    assert np.allclose(
        back.serve(TOOLS, SERVERS).correction(scores, intent),
        ranker.serve(TOOLS, SERVERS).correction(scores, intent),
        atol=1e-3,  # intents are stored as float16
    )
    assert read_version(to_bytes(config, params)).memory is None
    # served over a catalog that lost t00: executions that ran it count their other tool only
    smaller = back.serve(TOOLS[1:], SERVERS[1:])
    assert smaller.memory.use.sum() == sum(len(e.tools) for e in executions) - sum(
        "t00" in e.tools for e in executions
    )


def test_the_gate_weighs_the_memory_only_when_it_helps() -> None:
    rng = np.random.default_rng(4)
    judged = [Judged((int(i),)) for i in rng.integers(0, 20, size=30)]
    first = [rng.random(20) for _ in judged]
    useless = [np.zeros(20) for _ in judged]
    knows = [np.eye(20)[j.relevant[0]] for j in judged]
    (w, m, _), best = choose_weights(first, Corrections(useless, knows), judged)
    assert w == 0.0 and m > 0.0 and best.recall_at_1 == 1.0
    misleads = [1.0 - k for k in knows]
    (w, m, _), _ = choose_weights(first, Corrections(useless, misleads), judged)
    assert (w, m) == (0.0, 0.0)
    verdict = judge(first, first, Corrections(useless, knows), judged, min_judged=3)
    assert verdict.accepted and verdict.weights.memory > 0.0 and verdict.weights.shgat == 0.0
    assert verdict.as_metrics()["memory_weight"] == verdict.weights.memory


@pytest.mark.parametrize("bad", ["weights", "tools"])
def test_an_inconsistent_stored_memory_is_refused(bad: str) -> None:
    rng = np.random.default_rng(5)
    executions = _executions(rng)
    ranker = fit(executions, [rng.random(len(TOOLS)) for _ in executions], TOOLS, SERVERS)
    assert ranker is not None
    arrays = ranker.to_arrays()
    if bad == "weights":
        arrays["memory/weights"] = arrays["memory/weights"][:-1]
    else:
        arrays["memory/tools"] = np.frombuffer(b"[]", dtype=np.uint8)
    config = make_config(DIM, 8, len(TOOLS))
    blob = to_bytes(config, init_params(config, np.eye(len(TOOLS), DIM), 0), arrays)
    with pytest.raises(ValueError, match="inconsistent"):
        read_version(blob)
