"""The running system for end-to-end tests: search and trainer as real processes.

They run against the suite's Redis and Neo4j; tests reach them only through gRPC, Redis
Streams and the `pml` command.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import pytest

from pml.v1 import search_pb2_grpc
from pml_cli.local_stack import LocalStack, settings_to_env
from pml_common.local_runtime import ManagedProcess
from pml_common.settings import Settings

T = TypeVar("T")


@pytest.fixture(scope="module")
def stack(
    redis_server: ManagedProcess,
    neo4j_server: ManagedProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalStack]:
    state = tmp_path_factory.mktemp("e2e")
    stack = LocalStack.on_free_ports(state, reclaim_idle_ms=1000, log_format="console")
    stack.settings = stack.settings.model_copy(
        update={"redis_url": redis_server.url, "neo4j_uri": neo4j_server.url}
    )
    try:
        stack.start_services(["search", "trainer"])
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def e2e_settings(stack: LocalStack) -> Settings:
    return stack.settings


@pytest.fixture(scope="module")
def cli_env(stack: LocalStack) -> dict[str, str]:
    import os

    return {**os.environ, **settings_to_env(stack.settings)}


@pytest.fixture
def search_stub(e2e_settings: Settings) -> Iterator[search_pb2_grpc.SearchServiceStub]:
    with grpc.insecure_channel(e2e_settings.search_addr) as channel:
        yield search_pb2_grpc.SearchServiceStub(channel)


@pytest.fixture
def e2e_tenant() -> str:
    return f"e2e-{uuid.uuid4().hex[:10]}"


def _eventually(probe: Callable[[], T], ok: Callable[[T], bool], timeout: float = 30.0) -> T:
    """Poll `probe` until `ok(result)`; fail with the last result after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = probe()
    while not ok(last):
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s; last value: {last!r}")
        time.sleep(0.25)
        last = probe()
    return last


@pytest.fixture
def eventually() -> Callable[..., object]:
    return _eventually


@pytest.fixture
def pml(cli_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the `pml` command against the e2e system."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pml_cli", *args],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    return run
