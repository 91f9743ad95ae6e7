"""A suite that attacks: generated hostile requests and stream entries against the running system.

Each property sends what hypothesis generates (valid, malformed, oversized, deeply nested,
hostile tenants and ids) to the real services, then checks:

- every gRPC call ends OK or with INVALID_ARGUMENT, NOT_FOUND or RESOURCE_EXHAUSTED and a
  message, never INTERNAL or UNKNOWN;
- a refused request wrote nothing: no event published, the nodes it named unchanged;
- every stream entry is handled, or dead-lettered with a reason by every group that read it;
- after each example every service is still SERVING and search still answers;
- no reply to another tenant carries the victim's data, and at the end the victim's data is
  byte-for-byte what it was before the attacks.

Runs are bounded and reproducible: a fixed number of examples per property, derandomized (the
same examples on every run), no shrinking (a failure prints its example as generated). The
number of cases each property ran is printed at the end of the session (conftest's tally).
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from pml.v1 import common_pb2, ingest_pb2, search_pb2
from pml_common.events import Streams
from pml_common.testing import until

from . import hostile, wire
from .report import Tally
from .streams import BusWatch, Fields, entries_for, must_reject, named_nodes
from .system import Services, VictimState, victim_state

pytestmark = pytest.mark.e2e

ATTACK = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=(
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ),
    print_blob=False,
)

#: The streams only RPCs publish on (search's and ingest's; the trainer, the scorer and the
#: ingest workers publish on others as they consume, at any time): a refused RPC must leave
#: them as they were.
_PUBLISHED_BY_RPCS = (
    Streams.TOOLS_REGISTERED,
    Streams.CAPABILITY_LEARNED,
    Streams.TENANT_DELETED,
    Streams.DOCUMENT_SUBMITTED,
    Streams.DOCUMENT_DELETED,
)
_OK = grpc.StatusCode.OK
_INGEST = "/pml.v1.IngestService/"


def _assert_clear(answer: wire.Answer, what: object) -> None:
    assert answer.code in wire.CLEAR_CODES, (answer.code, answer.details, what)
    if answer.code != _OK:
        assert answer.details.strip(), (answer.code, "an error without a message", what)


def _assert_no_victim_data(answer: wire.Answer) -> None:
    assert hostile.VICTIM_MARK.encode() not in answer.reply, "a reply carries the victim's data"


def _heads(watch: BusWatch) -> dict[str, str]:
    return {stream: watch.last_id(stream) for stream in _PUBLISHED_BY_RPCS}


def _short(request: Message | bytes) -> str:
    text = repr(request)
    return text if len(text) < 600 else text[:600] + "…"


@settings(ATTACK, max_examples=50)
@given(attack=hostile.search_reads)
def test_search_reads_answer_clearly(
    services: Services, victim: VictimState, tally: Tally, attack: hostile.Request
) -> None:
    path, request = attack
    answer = services.call(path, request)
    tally.add("search reads", answer.code.name)
    _assert_clear(answer, _short(request))
    _assert_no_victim_data(answer)
    services.assert_answering()


@settings(ATTACK, max_examples=50)
@given(attack=hostile.other_services)
def test_knowledge_scorer_planner_and_ingest_status_answer_clearly(
    services: Services, victim: VictimState, tally: Tally, attack: hostile.Request
) -> None:
    path, request = attack
    answer = services.call(path, request)
    tally.add("knowledge, scorer, planner, ingest status", answer.code.name)
    _assert_clear(answer, _short(request))
    _assert_no_victim_data(answer)
    services.assert_answering()


def _named(request: Message) -> list[str]:
    if isinstance(request, search_pb2.RegisterToolsRequest):
        return [t.id for t in request.tools]
    if isinstance(request, search_pb2.RegisterCapabilitiesRequest):
        return [c.id for c in request.capabilities]
    return []


def _assert_stored(services: Services, request: Message, answer: wire.Answer) -> None:
    """What an accepted write named is found under its tenant, as it was sent."""
    tenant = request.tenant_id  # type: ignore[attr-defined]
    if isinstance(request, ingest_pb2.SubmitRequest):
        submitted = ingest_pb2.SubmitResponse.FromString(answer.reply).document_ids
        status = services.call(
            _INGEST + "GetStatus",
            ingest_pb2.GetStatusRequest(tenant_id=tenant, document_ids=submitted),
        )
        assert status.code == _OK, (list(submitted), status)
    if isinstance(request, search_pb2.RegisterToolsRequest):
        for tool in request.tools:
            found = search_pb2.SearchResult.FromString(services.node(tenant, tool.id).reply)
            assert (found.kind, found.name, found.description) == (
                search_pb2.NODE_KIND_TOOL,
                tool.name.strip(),
                tool.description,
            ), tool.id
    if isinstance(request, search_pb2.RegisterCapabilitiesRequest):
        for capability in request.capabilities:
            answer = services.node(tenant, capability.id)
            assert answer.code == _OK, (capability.id, answer)
            found = search_pb2.SearchResult.FromString(answer.reply)
            # GetNode looks tools up first: an id both a tool's and a capability's finds the tool
            if found.kind == search_pb2.NODE_KIND_CAPABILITY:
                assert found.name == capability.name.strip(), capability.id


@settings(ATTACK, max_examples=50)
@given(attack=hostile.writes)
@example(
    attack=(
        "/pml.v1.SearchService/RegisterCapabilities",
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id="attack-a", capabilities=[common_pb2.Capability(id=" padded", name="p")]
        ),
    )
)
def test_writes_answer_clearly_and_refused_ones_store_nothing(
    services: Services,
    victim: VictimState,
    bus_watch: BusWatch,
    tally: Tally,
    attack: hostile.Request,
) -> None:
    path, request = attack
    tenant = request.tenant_id  # type: ignore[attr-defined]
    named = _named(request)[:5]
    nodes = {n: services.node(tenant, n) for n in named}
    heads = _heads(bus_watch)
    answer = services.call(path, request)
    tally.add("writes (search, ingest)", answer.code.name)
    _assert_clear(answer, _short(request))
    if answer.code == _OK:
        _assert_stored(services, request, answer)
    else:
        assert _heads(bus_watch) == heads, "a refused request published an event"
        assert {n: services.node(tenant, n) for n in named} == nodes, "a refused request wrote"
    services.assert_answering()


@settings(ATTACK, max_examples=80)
@given(path=st.sampled_from(sorted(wire.methods())), payload=wire.raw_payloads)
def test_raw_bytes_are_answered_clearly(
    services: Services,
    victim: VictimState,
    bus_watch: BusWatch,
    tally: Tally,
    path: str,
    payload: bytes,
) -> None:
    heads = _heads(bus_watch)
    answer = services.call(path, payload)
    tally.add("raw protobuf bytes", answer.code.name)
    _assert_clear(answer, (path, payload[:200]))
    if answer.code != _OK:
        assert _heads(bus_watch) == heads, "a refused request published an event"
    services.assert_answering()


#: How long a batch of entries may take to be read and acknowledged by every group: a handler
#: that fails is retried `max_deliveries` times, one reclaim (1 s in the e2e stack) apart.
_SETTLE_S = 90


@settings(ATTACK, max_examples=30)
@given(data=st.data())
def test_stream_entries_are_handled_or_dead_lettered(
    services: Services,
    streams: list[str],
    bus_watch: BusWatch,
    tally: Tally,
    data: st.DataObject,
) -> None:
    entry = st.sampled_from(streams).flatmap(lambda s: entries_for(s).map(lambda f: (s, f)))
    batch: list[tuple[str, Fields]] = data.draw(st.lists(entry, min_size=1, max_size=4))
    rejected = [must_reject(stream, fields) for stream, fields in batch]
    untouchable = _nodes_of_rejected(services, batch, rejected)
    groups = {stream: bus_watch.live_groups(stream) for stream, _ in batch}
    start = bus_watch.last_id(Streams.DEAD_LETTER)
    added = [bus_watch.append(stream, fields) for stream, fields in batch]

    until(
        lambda: all(
            bus_watch.settled(stream, entry_id, groups[stream])
            for (stream, _), entry_id in zip(batch, added, strict=True)
        ),
        _SETTLE_S,
        "every group read and acknowledged the entries",
    )
    letters = bus_watch.dead_letters_after(start)
    for (stream, fields), entry_id, refused in zip(batch, added, rejected, strict=True):
        tally.add("stream entries", "dead-lettered" if refused else "handled")
        mine = [x for x in letters if x["stream"] == stream and x["entry_id"] == entry_id]
        what = (stream, {k: v[:300] for k, v in fields.items()}, mine)
        if refused:  # by every group that read it, each saying why
            assert sorted(x["group"] for x in mine) == sorted(groups[stream]), what
            assert all(x["reason"].strip() for x in mine), what
        else:
            assert not mine, what
    assert {k: services.node(*k) for k in untouchable} == untouchable, "a rejected entry wrote"
    services.assert_answering()


def _nodes_of_rejected(
    services: Services, batch: list[tuple[str, Fields]], rejected: list[bool]
) -> dict[tuple[str, str], wire.Answer]:
    """How GetNode answers now for the nodes the rejected entries of `batch` name (those no
    accepted entry of the batch names too): what they must still answer afterwards."""
    named = [
        (refused, named_nodes(fields)) for (_, fields), refused in zip(batch, rejected, strict=True)
    ]
    written = {
        (t, n)
        for refused, found in named
        if found and not refused
        for t, nodes in [found]
        for n in nodes
    }
    return {
        (tenant, node): services.node(tenant, node)
        for refused, found in named
        if found and refused
        for tenant, nodes in [found]
        for node in nodes[:5]
        if (tenant, node) not in written
    }


def test_victim_is_unchanged(services: Services, victim: VictimState, bus_watch: BusWatch) -> None:
    """Runs last: whatever the attacks above did, once every group has caught up, the victim
    tenant reads exactly as it did before them."""
    until(bus_watch.quiet, 120, "every running group caught up")
    now = victim_state(services)
    changed = [name for name in victim.replies if now.replies[name] != victim.replies[name]]
    assert not changed, f"the victim's {changed} changed"
