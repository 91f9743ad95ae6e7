"""The whole system with mutual TLS and bearer tokens on every gRPC endpoint, as an operator
turns them on: search, trainer, scorer and planner as real processes configured by `PML_*`
variables only (certificate files, a token file), reached by gRPC clients, the `pml` command and
the container health check.

Starting the stack already shows the health checks speaking mutual TLS without a token; the
planner's answers show the services calling each other over TLS with their token.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pml.v1 import common_pb2, planner_pb2, planner_pb2_grpc, search_pb2, search_pb2_grpc
from pml_cli.local_stack import LocalStack, settings_to_env
from pml_common.grpc_client import blocking_channel
from pml_common.local_runtime import ManagedProcess
from pml_common.settings import Settings
from pml_common.testing import TlsFiles

pytestmark = pytest.mark.e2e

TOKEN = uuid.uuid4().hex + uuid.uuid4().hex
TOOLS = {
    "report:build_weekly": "Build the weekly activity report as a PDF.",
    "mail:send": "Send an email with attachments to a list of recipients.",
}
CAPABILITY = "report-by-mail"
INTENT = "share the weekly report with the team by email"


@pytest.fixture(scope="module")
def secured(
    redis_server: ManagedProcess,
    neo4j_server: ManagedProcess,
    tls_files: TlsFiles,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalStack]:
    state = tmp_path_factory.mktemp("secured")
    token_file = state / "auth-token"
    token_file.write_text(TOKEN + "\n")
    stack = LocalStack.on_free_ports(
        state,
        log_format="console",
        tls_enabled=True,
        tls_client_auth=True,
        tls_cert_file=str(tls_files.server_cert),
        tls_key_file=str(tls_files.server_key),
        tls_ca_file=str(tls_files.ca),
        auth_enabled=True,
        auth_token_file=str(token_file),
    )
    stack.settings = stack.settings.model_copy(
        update={"redis_url": redis_server.url, "neo4j_uri": neo4j_server.url}
    )
    try:
        stack.start_services(["search", "trainer", "scorer", "planner"])
        yield stack
    finally:
        stack.stop()


def _client(stack: LocalStack, **changes: Any) -> Settings:
    """The stack's settings as a client holding them, with `changes`."""
    return stack.settings.model_copy(update=changes)


def _get_node(settings: Settings, tenant: str = "default") -> grpc.StatusCode:
    with blocking_channel(settings.search_addr, settings) as channel:
        try:
            search_pb2_grpc.SearchServiceStub(channel).GetNode(
                search_pb2.GetNodeRequest(tenant_id=tenant, id="fs:nothing"), timeout=10
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_only_a_client_with_a_certificate_and_the_token_gets_through(
    secured: LocalStack, tls_files: TlsFiles
) -> None:
    assert _get_node(_client(secured, tls_enabled=False)) == grpc.StatusCode.UNAVAILABLE
    without_certificate = _client(secured, tls_cert_file="", tls_key_file="", tls_client_auth=False)
    assert _get_node(without_certificate) == grpc.StatusCode.UNAVAILABLE
    foreign_certificate = _client(
        secured, tls_cert_file=str(tls_files.other_cert), tls_key_file=str(tls_files.other_key)
    )
    assert _get_node(foreign_certificate) == grpc.StatusCode.UNAVAILABLE
    without_token = _client(secured, auth_token=None)
    assert _get_node(without_token) == grpc.StatusCode.UNAUTHENTICATED
    # Past TLS and the token, the request itself is answered: the id is simply unknown.
    assert _get_node(_client(secured)) == grpc.StatusCode.NOT_FOUND


def test_services_call_each_other_over_tls_with_their_token(
    secured: LocalStack, eventually: Callable[..., Any]
) -> None:
    tenant = f"secured-{uuid.uuid4().hex[:8]}"
    settings = _client(secured)
    with blocking_channel(settings.search_addr, settings) as channel:
        search = search_pb2_grpc.SearchServiceStub(channel)
        search.RegisterTools(
            search_pb2.RegisterToolsRequest(
                tenant_id=tenant,
                tools=[
                    common_pb2.Tool(id=i, name=i.split(":")[1], description=d)
                    for i, d in TOOLS.items()
                ],
            ),
            timeout=60,
        )
        search.RegisterCapabilities(
            search_pb2.RegisterCapabilitiesRequest(
                tenant_id=tenant,
                capabilities=[
                    common_pb2.Capability(
                        id=CAPABILITY, name=CAPABILITY, description=INTENT, tools=list(TOOLS)
                    )
                ],
            ),
            timeout=60,
        )
    planner_log = next(p for p in secured.processes if p.name == "planner").log_path
    with blocking_channel(settings.planner_addr, settings) as channel:
        planner = planner_pb2_grpc.PlannerServiceStub(channel)

        def dag() -> planner_pb2.SuggestDagResponse:
            return planner.SuggestDag(
                planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=INTENT), timeout=30
            )

        first = eventually(dag, lambda reply: reply.target_capability == CAPABILITY, timeout=120)
        assert set(first.nodes) == {CAPABILITY, *TOOLS}
        # The planner asks the scorer for the target (its first call for a tenant may outlast
        # the planner's deadline while the scorer loads the tenant): once warm, every call
        # reaches the scorer, which a refused handshake or token would prevent every time.
        misses = planner_log.read_text().count("planner.scorer_unavailable")
        for _ in range(3):
            assert dag().target_capability == CAPABILITY
        assert planner_log.read_text().count("planner.scorer_unavailable") == misses
        # The search method asks search for its candidates.
        step = planner.PredictNext(
            planner_pb2.PredictNextRequest(tenant_id=tenant, intent=INTENT, method="search"),
            timeout=30,
        )
        assert {c.tool for c in step.candidates} == set(TOOLS)
    for refused in ("UNAUTHENTICATED", "code=UNAVAILABLE"):
        assert refused not in planner_log.read_text()


def _cli_env(stack: LocalStack, **changes: str) -> dict[str, str]:
    return {**os.environ, **settings_to_env(stack.settings), **changes}


def test_the_pml_command_and_the_health_check_use_the_settings(secured: LocalStack) -> None:
    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", *args], env=env, capture_output=True, text=True, timeout=120
        )

    env = _cli_env(secured)
    found = run(env, "pml_cli", "search", "email a report", "--json")
    assert found.returncode == 0, found.stderr

    # A token file that holds another token: refused, with a message and a non-zero exit.
    wrong = Path(secured.state_dir) / "wrong-token"
    wrong.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    refused = run(
        _cli_env(secured, PML_AUTH_TOKEN="", PML_AUTH_TOKEN_FILE=str(wrong)),
        "pml_cli",
        "search",
        "email a report",
    )
    assert refused.returncode == 2
    assert "UNAUTHENTICATED" in refused.stderr and "invalid bearer token" in refused.stderr

    health = [sys.executable, "-m", "pml_common.healthcheck", secured.settings.planner_addr]
    assert subprocess.run(health, env=env, timeout=30).returncode == 0
    plaintext = {**env, "PML_TLS_ENABLED": "false"}
    assert subprocess.run(health, env=plaintext, timeout=30).returncode == 1
