"""When a pending tenant's round may start: a burst waits for its end, a stream does not wait
for ever."""

from __future__ import annotations

import pytest

from pml_trainer.round_timing import RoundTiming


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_is_ready_once_its_executions_stop_arriving() -> None:
    clock = _Clock()
    timing = RoundTiming(quiet_s=5.0, max_wait_s=60.0, clock=clock)
    assert not timing.ready("t", 16)
    clock.now += 4.0
    assert not timing.ready("t", 20)  # still arriving: the quiet period starts again
    clock.now += 4.0
    assert not timing.ready("t", 20)
    clock.now += 1.0
    assert timing.ready("t", 20)


def test_a_steady_stream_is_trained_after_the_longest_wait() -> None:
    clock = _Clock()
    timing = RoundTiming(quiet_s=5.0, max_wait_s=30.0, clock=clock)
    added = 16
    for _ in range(15):
        assert not timing.ready("t", added)
        clock.now += 2.0
        added += 1
    assert timing.ready("t", added)  # 30 s after it began to wait, though never quiet


def test_a_started_round_makes_later_executions_wait_for_the_next() -> None:
    clock = _Clock()
    timing = RoundTiming(quiet_s=5.0, max_wait_s=30.0, clock=clock)
    timing.ready("t", 16)
    clock.now += 40.0
    assert timing.ready("t", 16)
    assert timing.started("t") == 40.0  # how long the executions waited, for the log
    assert not timing.ready("t", 18)  # arrived during the round: a new wait begins
    clock.now += 5.0
    assert timing.ready("t", 18)


def test_tenants_wait_apart() -> None:
    clock = _Clock()
    timing = RoundTiming(quiet_s=5.0, max_wait_s=30.0, clock=clock)
    timing.ready("quiet", 16)
    clock.now += 3.0
    timing.ready("busy", 16)
    clock.now += 2.0
    assert timing.ready("quiet", 16)
    assert not timing.ready("busy", 17)


def test_a_tenant_no_longer_pending_waits_afresh() -> None:
    clock = _Clock()
    timing = RoundTiming(quiet_s=5.0, max_wait_s=30.0, clock=clock)
    assert timing.ready_among({"a": 16, "b": 16}) == []
    clock.now += 40.0
    assert timing.ready_among({"b": 16}) == ["b"]  # "a" was trained or deleted meanwhile
    assert timing.ready_among({"a": 20, "b": 16}) == ["b"]  # "a" pending again: a new wait
    clock.now += 5.0
    assert timing.ready_among({"a": 20, "b": 16}) == ["a", "b"]


def test_no_quiet_period_starts_rounds_at_once() -> None:
    assert RoundTiming(quiet_s=0.0, max_wait_s=0.0, clock=_Clock()).ready("t", 16)


@pytest.mark.parametrize(("quiet", "longest"), [(-1.0, 10.0), (10.0, 5.0)])
def test_inconsistent_waits_are_refused(quiet: float, longest: float) -> None:
    with pytest.raises(ValueError, match="quiet_s"):
        RoundTiming(quiet_s=quiet, max_wait_s=longest)
