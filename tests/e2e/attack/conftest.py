"""The attacked system (the e2e stack, with the scorer, the planner and ingest too), the victim tenant
registered before any attack, and the count of generated cases printed at the end of the run."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from pml_cli.local_stack import STORES, LocalStack

from . import wire
from .hostile import VICTIM_MARK
from .report import Tally
from .streams import BusWatch, watch
from .system import Services, VictimState, register_victim, victim_state

_TALLY = pytest.StashKey[Tally]()


@pytest.fixture(scope="session")
def tally(request: pytest.FixtureRequest) -> Tally:
    return request.config.stash.setdefault(_TALLY, Tally())


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    tally = config.stash.get(_TALLY, None)
    if tally is None or not tally.cases:
        return
    terminalreporter.section("attack properties: generated cases")
    for prop, outcomes in tally.cases.items():
        shown = ", ".join(f"{outcome} {n}" for outcome, n in sorted(outcomes.items()))
        terminalreporter.write_line(f"{prop}: {sum(outcomes.values())} cases ({shown})")
    total = sum(sum(o.values()) for o in tally.cases.values())
    terminalreporter.write_line(f"total: {total} generated cases")


@pytest.fixture(scope="module")
def attacked(stack: LocalStack) -> LocalStack:
    # each waited for until SERVING (ingest with its pass workers)
    stack.start_services(["scorer", "planner", "ingest"])
    return stack


@pytest.fixture(scope="module")
def services(attacked: LocalStack) -> Iterator[Services]:
    settings = attacked.settings
    by_address = {
        address: grpc.insecure_channel(address)
        for address in set(wire.addresses(settings).values())
    }
    try:
        yield Services(
            settings,
            {name: by_address[address] for name, address in wire.addresses(settings).items()},
            [p.url for p in attacked.processes if p.name not in STORES],
        )
    finally:
        for channel in by_address.values():
            channel.close()


@pytest.fixture(scope="module")
def bus_watch(attacked: LocalStack) -> Iterator[BusWatch]:
    bus = watch(
        attacked.settings.redis_url, [p.pid for p in attacked.processes if p.name not in STORES]
    )
    try:
        yield bus
    finally:
        bus.close()


@pytest.fixture(scope="module")
def victim(services: Services, bus_watch: BusWatch) -> VictimState:
    """The victim's data as the read RPCs showed it before any attack."""
    register_victim(services, bus_watch)
    state = victim_state(services)
    # the reads that quote texts show the victim's: comparing them later proves something
    shown = [name for name, reply in state.replies.items() if VICTIM_MARK.encode() in reply]
    assert {"Search", "SearchTools", "Ask"} <= set(shown), shown
    return state


@pytest.fixture(scope="module")
def streams(bus_watch: BusWatch, victim: VictimState) -> list[str]:
    """The event streams some running group reads, once every service is up: fixed for the
    module, since hypothesis needs the same choices from one example to the next."""
    return bus_watch.attacked_streams()
