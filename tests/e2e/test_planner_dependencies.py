"""When a service the planner calls fails, the planner's caller learns which one and how.

The planner asks the scorer for the intent's target and falls back on search; search is its
last resort. Search is made to not answer (SIGSTOP: the process is there, the calls hang) and
then to be gone (SIGKILL): the planner answers DEADLINE_EXCEEDED, then UNAVAILABLE, naming
search, never INTERNAL. The `pml plan dag` a user runs says the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from pml.v1 import planner_pb2, planner_pb2_grpc
from pml_cli.local_stack import LocalStack
from pml_common.local_runtime import ManagedProcess


@pytest.fixture(scope="module")
def planner(stack: LocalStack) -> Iterator[planner_pb2_grpc.PlannerServiceStub]:
    stack.start_services(["scorer", "planner"])
    with grpc.insecure_channel(stack.settings.planner_addr) as channel:
        yield planner_pb2_grpc.PlannerServiceStub(channel)


def _search(stack: LocalStack) -> ManagedProcess:
    return next(p for p in stack.processes if p.name == "search")


def _suggest(planner: planner_pb2_grpc.PlannerServiceStub) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        planner.SuggestDag(
            planner_pb2.SuggestDagRequest(tenant_id="deps", intent="read a file"), timeout=60
        )
    return failed.value


def test_search_not_answering_is_a_deadline_naming_search(
    stack: LocalStack, planner: planner_pb2_grpc.PlannerServiceStub, cli_env: dict[str, str]
) -> None:
    search = _search(stack)
    os.kill(search.pid, signal.SIGSTOP)
    try:
        error = _suggest(planner)
        cli = subprocess.run(
            [sys.executable, "-m", "pml_cli", "plan", "dag", "read a file", "--tenant", "deps"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.kill(search.pid, signal.SIGCONT)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
    assert error.details() == "search did not answer within 5 s"
    assert cli.returncode != 0
    assert "DEADLINE_EXCEEDED: search did not answer within 5 s" in " ".join(cli.stderr.split())


def test_search_gone_is_unavailable_naming_search(
    stack: LocalStack, planner: planner_pb2_grpc.PlannerServiceStub
) -> None:
    _search(stack).kill()  # the last test of the module: nothing needs search afterwards
    error = _suggest(planner)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert error.details().startswith("search failed (UNAVAILABLE"), error.details()
