"""Tenant isolation and injection-shaped input, through the public gRPC APIs and event streams
of the running search, trainer, scorer and planner.

- Tenant A can neither read nor change tenant B's catalog, capabilities, scores or plans, even
  when both use the same ids.
- Names, ids, tenants, queries and event fields shaped like Cypher (or Redis key patterns, or
  unicode look-alikes) are stored and matched as plain data everywhere they are accepted, and
  the graph of a bystander tenant is intact afterwards. The graph is counted directly in Neo4j,
  read only: that count is the property under test.

That no Cypher text is built from input at all is checked statically over the whole code base
by tests/static/test_no_cypher_from_input.py. The knowledge side (Ask over the same document ids
in two tenants, a deletion in one, injection-shaped questions and tenants) is covered where its
ingestion pipeline runs: tests/e2e/test_knowledge.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import neo4j
import pytest

from pml.v1 import (
    common_pb2,
    planner_pb2,
    planner_pb2_grpc,
    scorer_pb2,
    scorer_pb2_grpc,
    search_pb2,
    search_pb2_grpc,
)
from pml_cli.client import publish_events
from pml_cli.local_stack import LocalStack
from pml_common.events import (
    CapabilityLearned,
    CapabilitySpec,
    ExecutionCompleted,
    ExecutionStep,
    ToolSpec,
    ToolsRegistered,
)
from pml_common.settings import Settings

pytestmark = pytest.mark.e2e

PLAN_METHODS = ("drdsp", "legacy", "discovery", "search", "blend")

# Tenant B's private catalog; A uses some of the same ids with other meanings.
B_TOOLS = {
    "fs:read_file": "Read the confidential payroll ledger file of the finance team.",
    "ledger:export": "Export the confidential payroll ledger with every salary.",
    "mail:send": "Send an email message with attachments.",
}
B_CAPABILITY = ("payroll-export", "Export the payroll ledger and mail it to the auditors")
B_MEMBERS = ["ledger:export", "mail:send"]
B_ONLY = {"ledger:export", "payroll-export"}
B_INTENT = "export the payroll ledger and mail it to the auditors"

A_TOOLS = {
    "fs:read_file": "Read a text file from the local disk.",
    "fs:write_file": "Write a text file to the local disk.",
    "mail:send": "Send an email message.",
}
A_CAPABILITY = ("share-note", "Read a note from disk and email it to a friend")
A_MEMBERS = ["fs:read_file", "mail:send"]

#: Text that would change the graph if it were ever spliced into Cypher, or match other keys if
#: it were used as a Redis pattern, or look like another tenant to a careless comparison.
INJECTIONS = (
    "x'}) MATCH (n) DETACH DELETE n //",
    '") MATCH (n) DETACH DELETE n RETURN 1 //',
    "$tenant",
    "${tenant}",
    "{tenant_id: $tenant}",
    "`Tool` {tenant_id: 'b'}) DETACH DELETE n //",
    "x' OR 1=1 --",
    "*",
    "pml:model:*",
    "'; FLUSHALL; '",
    "ｘ'}) ＭＡＴＣＨ (n) ＤＥＴＡＣＨ ＤＥＬＥＴＥ n",  # fullwidth look-alikes
    "a\u200b'}) MATCH (n) DELETE n",  # zero-width space
    "\u202e'}) MATCH (n) DELETE n",  # right-to-left override
    "\\'}) MATCH (n) DELETE n //",
)
#: The same ideas, shaped as tool ids (`<server>:<tool>`, no whitespace) so they are accepted.
INJECTED_TOOL_IDS = (
    "x'})-[r]-()DELETE:r//",
    "$tenant:$id",
    "`Tool`:{tenant_id:'b'}",
    "n:Tool)DETACH_DELETE_n//",
    "*:*",
    "\u202e:x'})",
    "ｔｏｏｌ:ＭＡＴＣＨ",
)
ACCEPTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


@dataclass(frozen=True)
class Stubs:
    search: search_pb2_grpc.SearchServiceStub
    scorer: scorer_pb2_grpc.ScorerServiceStub
    planner: planner_pb2_grpc.PlannerServiceStub


@pytest.fixture(scope="module")
def stubs(stack: LocalStack) -> Iterator[Stubs]:
    stack.start_services(["scorer", "planner"])
    s = stack.settings
    with (
        grpc.insecure_channel(s.search_addr) as search,
        grpc.insecure_channel(s.scorer_addr) as scorer,
        grpc.insecure_channel(s.planner_addr) as planner,
    ):
        yield Stubs(
            search_pb2_grpc.SearchServiceStub(search),
            scorer_pb2_grpc.ScorerServiceStub(scorer),
            planner_pb2_grpc.PlannerServiceStub(planner),
        )


def _tool_messages(tools: dict[str, str]) -> list[common_pb2.Tool]:
    return [
        common_pb2.Tool(id=i, server=i.split(":")[0], name=i.split(":")[1], description=d)
        for i, d in tools.items()
    ]


def _register(
    stubs: Stubs,
    tenant: str,
    tools: dict[str, str],
    capability: tuple[str, str],
    members: list[str],
) -> None:
    stubs.search.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=_tool_messages(tools)), timeout=60
    )
    cap_id, description = capability
    stubs.search.RegisterCapabilities(
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id=tenant,
            capabilities=[
                common_pb2.Capability(
                    id=cap_id, name=cap_id, description=description, tools=members
                )
            ],
        ),
        timeout=60,
    )


@pytest.fixture
def tenants(stubs: Stubs, eventually: Callable[..., Any]) -> tuple[str, str]:
    """Fresh tenants A and B with their catalogs, learned by the trainer, scorer and planner."""
    a, b = f"e2e-a-{uuid.uuid4().hex[:8]}", f"e2e-b-{uuid.uuid4().hex[:8]}"
    _register(stubs, a, A_TOOLS, A_CAPABILITY, A_MEMBERS)
    _register(stubs, b, B_TOOLS, B_CAPABILITY, B_MEMBERS)
    for tenant, capability in ((a, A_CAPABILITY[0]), (b, B_CAPABILITY[0])):
        eventually(
            lambda t=tenant: stubs.scorer.ModelInfo(
                scorer_pb2.ModelInfoRequest(tenant_id=t), timeout=30
            ),
            lambda info: info.num_capabilities == 1 and info.num_tools == 3,
            timeout=120,
        )
        eventually(
            lambda t=tenant: _dag(stubs, t, B_INTENT),
            lambda dag, c=capability: dag.target_capability == c,
            timeout=120,
        )
    return a, b


def _dag(stubs: Stubs, tenant: str, intent: str) -> planner_pb2.SuggestDagResponse:
    return stubs.planner.SuggestDag(
        planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=intent), timeout=30
    )


def _status(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def view_of(stubs: Stubs, tenant: str) -> dict[str, Any]:
    """Everything a caller can observe of `tenant` through the APIs, as plain data."""
    nodes = {}
    for node_id in [*B_TOOLS, B_CAPABILITY[0]]:
        try:
            node = stubs.search.GetNode(
                search_pb2.GetNodeRequest(tenant_id=tenant, id=node_id), timeout=30
            )
            nodes[node_id] = (node.name, node.description, node.executions, node.success_rate)
        except grpc.RpcError as exc:
            nodes[node_id] = exc.code().name
    search = stubs.search.Search(
        search_pb2.SearchRequest(tenant_id=tenant, query=B_INTENT, limit=10), timeout=30
    )
    scores = stubs.scorer.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=B_INTENT, top_k=10), timeout=30
    )
    tools = stubs.scorer.ScoreTools(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=B_INTENT, top_k=10), timeout=30
    )
    info = stubs.scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
    dag = _dag(stubs, tenant, B_INTENT)
    return {
        "nodes": nodes,
        "search": [(r.id, round(r.final_score, 6)) for r in search.results],
        "capability_scores": [(s.id, round(s.score, 6)) for s in scores.scores],
        "tool_scores": [(s.id, round(s.score, 6)) for s in tools.scores],
        "model": (info.version, info.num_tools, info.num_capabilities),
        "dag": (dag.target_capability, list(dag.nodes), list(dag.order), dag.threshold),
    }


_TENANT_GRAPH = """
MATCH (n {tenant_id: $tenant})
OPTIONAL MATCH (n)-[r]->()
RETURN labels(n)[0] AS label, count(DISTINCT n) AS nodes, count(r) AS relationships
ORDER BY label
"""


def graph_counts(settings: Settings, tenant: str) -> list[tuple[str, int, int]]:
    with neo4j.GraphDatabase.driver(settings.neo4j_uri, auth=None) as driver:
        records, _, _ = driver.execute_query(
            _TENANT_GRAPH, tenant=tenant, database_=settings.neo4j_database
        )
    return [(r["label"], r["nodes"], r["relationships"]) for r in records]


# --- isolation -----------------------------------------------------------------------------------


def test_tenant_a_cannot_read_tenant_b(stubs: Stubs, tenants: tuple[str, str]) -> None:
    a, _ = tenants
    a_ids = set(A_TOOLS) | {A_CAPABILITY[0]}

    found = stubs.search.Search(
        search_pb2.SearchRequest(tenant_id=a, query=B_INTENT, limit=20), timeout=30
    )
    assert found.results and {r.id for r in found.results} <= a_ids
    shared = stubs.search.GetNode(search_pb2.GetNodeRequest(tenant_id=a, id="fs:read_file"))
    assert shared.description == A_TOOLS["fs:read_file"]
    for b_only in B_ONLY:
        code = _status(
            lambda i=b_only: stubs.search.GetNode(search_pb2.GetNodeRequest(tenant_id=a, id=i))
        )
        assert code == grpc.StatusCode.NOT_FOUND
    code = _status(
        lambda: stubs.search.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=a, query=B_INTENT, context_tools=["ledger:export"]
            )
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND

    capabilities = stubs.scorer.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=a, text=B_INTENT, top_k=20), timeout=30
    )
    assert [s.id for s in capabilities.scores] == [A_CAPABILITY[0]]
    tools = stubs.scorer.ScoreTools(
        scorer_pb2.ScoreRequest(tenant_id=a, text=B_INTENT, top_k=20), timeout=30
    )
    assert {s.id for s in tools.scores} == set(A_TOOLS)
    by_level = stubs.scorer.TopByLevel(
        scorer_pb2.TopByLevelRequest(tenant_id=a, intent=B_INTENT, k=20), timeout=30
    )
    assert {s.id for level in by_level.levels for s in level.scores} == {A_CAPABILITY[0]}
    unknown = stubs.scorer.PredictPathSuccess(
        scorer_pb2.PredictPathSuccessRequest(
            tenant_id=a, intent=B_INTENT, path=["ledger:export", "payroll-export"]
        ),
        timeout=30,
    )
    assert unknown.probability == 0.5  # nodes A does not have are unknown, not B's
    info = stubs.scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=a), timeout=30)
    assert (info.num_tools, info.num_capabilities) == (3, 1)

    dag = _dag(stubs, a, B_INTENT)
    assert set(dag.nodes) <= a_ids and dag.target_capability == A_CAPABILITY[0]
    for method in PLAN_METHODS:
        step = stubs.planner.PredictNext(
            planner_pb2.PredictNextRequest(
                tenant_id=a, intent=B_INTENT, context_tools=["ledger:export"], method=method
            ),
            timeout=30,
        )
        assert {c.tool for c in step.candidates} <= a_ids, method
        assert step.target_capability in ("", A_CAPABILITY[0]), method


def test_tenant_a_cannot_change_tenant_b(
    stubs: Stubs,
    tenants: tuple[str, str],
    stack: LocalStack,
    eventually: Callable[..., Any],
) -> None:
    a, b = tenants
    before = view_of(stubs, b)
    graph_before = graph_counts(stack.settings, b)

    # A redefines B's ids, learns a capability of B's name, runs (and fails) B's tools...
    stubs.search.RegisterTools(
        search_pb2.RegisterToolsRequest(
            tenant_id=a,
            tools=_tool_messages({i: f"A's own {i}" for i in B_TOOLS}),
        ),
        timeout=60,
    )
    stubs.search.RegisterCapabilities(
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id=a,
            capabilities=[
                common_pb2.Capability(
                    id=B_CAPABILITY[0], name="A's", description="A's", tools=["fs:write_file"]
                )
            ],
        ),
        timeout=60,
    )
    failures = [
        ExecutionCompleted.create(
            tenant_id=a,
            intent=B_INTENT,
            steps=[
                ExecutionStep(node_id="ledger:export", success=False, error="denied"),
                ExecutionStep(node_id="mail:send", success=False, error="denied"),
            ],
            outcome="failure",
            capability_id=B_CAPABILITY[0],
        )
        for _ in range(3)
    ]
    asyncio.run(publish_events(stack.settings, failures))
    eventually(
        lambda: stubs.search.GetNode(
            search_pb2.GetNodeRequest(tenant_id=a, id="ledger:export"), timeout=30
        ),
        lambda node: node.executions == 3,
        timeout=60,
    )
    # ...and A's suggestions for B's intent are asked for and resolved by those failures.
    for method in PLAN_METHODS:
        stubs.planner.PredictNext(
            planner_pb2.PredictNextRequest(tenant_id=a, intent=B_INTENT, method=method), timeout=30
        )
    assert view_of(stubs, b) == before
    assert graph_counts(stack.settings, b) == graph_before

    # Deleting A leaves B whole.
    stubs.search.DeleteTenant(search_pb2.DeleteTenantRequest(tenant_id=a), timeout=60)
    eventually(lambda: graph_counts(stack.settings, a), lambda counts: counts == [], timeout=60)
    assert view_of(stubs, b) == before
    assert graph_counts(stack.settings, b) == graph_before


# --- injection-shaped input ----------------------------------------------------------------------


def _accepted_or_refused(call: Callable[[], Any], where: str) -> None:
    """The call answers, or refuses the input as bad or unknown: never an internal error."""
    code = _status(call)
    assert code == grpc.StatusCode.OK or code in ACCEPTED, f"{where}: {code}"


def _feed_search(stubs: Stubs, tenant: str, text: str, tool_id: str, b: str) -> None:
    search = stubs.search
    _accepted_or_refused(
        lambda: search.RegisterTools(
            search_pb2.RegisterToolsRequest(
                tenant_id=tenant,
                tools=[
                    common_pb2.Tool(
                        id=tool_id,
                        name=text,
                        description=text,
                        input_schema_json=json.dumps({"properties": {text: {"type": text}}}),
                    )
                ],
            ),
            timeout=60,
        ),
        "RegisterTools",
    )
    _accepted_or_refused(
        lambda: search.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(
                tenant_id=tenant,
                capabilities=[
                    common_pb2.Capability(
                        id=text, name=text, description=text, tools=[tool_id], capabilities=["*"]
                    )
                ],
            ),
            timeout=60,
        ),
        "RegisterCapabilities",
    )
    for kinds in ([], [search_pb2.NODE_KIND_TOOL], [search_pb2.NODE_KIND_CAPABILITY]):
        _accepted_or_refused(
            lambda k=kinds: search.Search(
                search_pb2.SearchRequest(tenant_id=tenant, query=text, kinds=k), timeout=30
            ),
            "Search",
        )
    _accepted_or_refused(
        lambda: search.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=tenant, query=text, context_tools=[tool_id], include_related=True
            ),
            timeout=30,
        ),
        "SearchTools",
    )
    for node_id in (text, tool_id):
        _accepted_or_refused(
            lambda i=node_id: search.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id=i)),
            "GetNode",
        )
        # B is asked for the injected ids: unknown there, whatever they look like.
        code = _status(
            lambda i=node_id: search.GetNode(search_pb2.GetNodeRequest(tenant_id=b, id=i))
        )
        assert code == grpc.StatusCode.NOT_FOUND, node_id


def _feed_scorer(stubs: Stubs, tenant: str, text: str, tool_id: str) -> None:
    scorer = stubs.scorer
    for call, where in (
        (
            lambda: scorer.ScoreCapabilities(scorer_pb2.ScoreRequest(tenant_id=tenant, text=text)),
            "ScoreCapabilities",
        ),
        (
            lambda: scorer.ScoreTools(scorer_pb2.ScoreRequest(tenant_id=tenant, text=text)),
            "ScoreTools",
        ),
        (
            lambda: scorer.TopByLevel(scorer_pb2.TopByLevelRequest(tenant_id=tenant, intent=text)),
            "TopByLevel",
        ),
        (
            lambda: scorer.PredictPathSuccess(
                scorer_pb2.PredictPathSuccessRequest(
                    tenant_id=tenant, intent=text, path=[tool_id, text]
                )
            ),
            "PredictPathSuccess",
        ),
        (lambda: scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant)), "ModelInfo"),
    ):
        _accepted_or_refused(call, where)


def _feed_planner(stubs: Stubs, tenant: str, text: str, tool_id: str) -> None:
    planner = stubs.planner
    for method in (*PLAN_METHODS, text):
        _accepted_or_refused(
            lambda m=method: planner.PredictNext(
                planner_pb2.PredictNextRequest(
                    tenant_id=tenant, intent=text, context_tools=[tool_id, text], method=m
                ),
                timeout=30,
            ),
            f"PredictNext {method}",
        )
        _accepted_or_refused(
            lambda m=method: planner.SuggestDag(
                planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=text, method=m), timeout=30
            ),
            f"SuggestDag {method}",
        )


def _injected_events(tenant: str, text: str, tool_id: str) -> list[Any]:
    return [
        ToolsRegistered.create(
            tenant_id=tenant,
            event_id=f"ev-{uuid.uuid4().hex[:6]}-{text}"[:128],
            tools=[ToolSpec(id=tool_id, server=tool_id.split(":")[0], name=text, description=text)],
        ),
        CapabilityLearned.create(
            tenant_id=tenant,
            capability=CapabilitySpec(
                id=f"cap {text}", name=text, description=text, tools=[tool_id], capabilities=[text]
            ),
        ),
        ExecutionCompleted.create(
            tenant_id=tenant,
            intent=text,
            steps=[
                ExecutionStep(node_id=tool_id, success=True),
                ExecutionStep(node_id=text, success=False, error=text, depends_on=[tool_id]),
            ],
            outcome="partial",
            capability_id=f"cap {text}",
        ),
    ]


def test_injection_shaped_input_is_data_everywhere(
    stubs: Stubs,
    tenants: tuple[str, str],
    stack: LocalStack,
    eventually: Callable[..., Any],
) -> None:
    _, b = tenants
    before = view_of(stubs, b)
    graph_before = graph_counts(stack.settings, b)
    assert graph_before, "tenant B has a graph to lose"
    injected: list[tuple[str, str]] = []  # (tenant, tool id) of every injection tenant
    events = []
    for n, text in enumerate(INJECTIONS):
        tool_id = INJECTED_TOOL_IDS[n % len(INJECTED_TOOL_IDS)]
        # Each shape is tried as a tenant of its own and as data in B's neighbour tenant.
        for tenant in (text, f"e2e-inj-{n}-{uuid.uuid4().hex[:6]}"):
            _feed_search(stubs, tenant, text, tool_id, b)
            _feed_scorer(stubs, tenant, text, tool_id)
            _feed_planner(stubs, tenant, text, tool_id)
            injected.append((tenant, tool_id))
        events.extend(_injected_events(text, text, tool_id))
        events.extend(_injected_events(injected[-1][0], text, tool_id))
    asyncio.run(publish_events(stack.settings, events))

    # The executions were applied to the injected ids, as data, in their own tenants.
    for tenant, tool_id in injected:
        node = eventually(
            lambda t=tenant, i=tool_id: stubs.search.GetNode(
                search_pb2.GetNodeRequest(tenant_id=t, id=i), timeout=30
            ),
            lambda found: found.executions >= 1,
            timeout=90,
        )
        assert node.id == tool_id
    assert view_of(stubs, b) == before
    assert graph_counts(stack.settings, b) == graph_before

    # Deleting tenants named like patterns deletes those tenants only.
    for tenant, _ in injected:
        stubs.search.DeleteTenant(search_pb2.DeleteTenantRequest(tenant_id=tenant), timeout=60)
    for tenant, _ in injected:
        eventually(lambda t=tenant: graph_counts(stack.settings, t), lambda c: c == [], timeout=90)
    assert view_of(stubs, b) == before
    assert graph_counts(stack.settings, b) == graph_before
