"""Memory per tenant and per N tools: `pml bench memory --tools 10000 --json`.

Starts a private system (Redis, Neo4j, search, trainer, scorer, planner), then measures the
resident memory (RSS) of each service and Redis's memory: after a warm-up (a tenant of 5 tools
registered and asked of every service, so that models and libraries are loaded), after one
tenant of `--tools` synthetic tools (the catalog `pml bench search` registers) was, and after
`--tenants` more small tenants of `--tenant-tools` tools each were. Registering leaves its own
peaks in a process's RSS, so search, the scorer and the planner are then restarted and measured
before and after one request for the large tenant: that difference is what holding the tenant
in memory costs, the figure the per-process bounds are sized with. The figures of
docs/operations.md ("Memory") come from it. Stdout carries only the JSON result; the phases are
shown on stderr.

RSS is read from /proc (Linux); Python rarely returns freed memory to the system, so read the
differences as what holding the tenants costs, not as what dropping them would give back.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from pml.v1 import planner_pb2, scorer_pb2, search_pb2
from pml_cli import client
from pml_cli.bench_search import synthetic_catalog
from pml_cli.local_stack import LocalStack
from pml_cli.phases import counted_phase, phase, step
from pml_common import redis_keys
from pml_common.events import Streams
from pml_common.local_runtime import ManagedProcess
from pml_common.settings import Settings

SERVICES = ("search", "trainer", "scorer", "planner")
#: The services that keep tenants in memory, restarted to measure that alone.
CACHING = ("search", "scorer", "planner")
MB = 1024 * 1024


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid`, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"process {pid} has no VmRSS")


def redis_mb(settings: Settings) -> dict[str, float]:
    """Redis's memory: the whole dataset, the embedding cache, the streams (MiB)."""
    with redis.Redis.from_url(settings.redis_url) as r:
        used = int(r.info("memory")["used_memory"])
        cache = sum(
            int(r.memory_usage(key, samples=0) or 0)
            for key in r.scan_iter(match=redis_keys.embedding("*", "*", "*"), count=1000)
        )
        names = [v for k, v in vars(Streams).items() if k.isupper() and isinstance(v, str)]
        streams = sum(int(r.memory_usage(name, samples=0) or 0) for name in names)
        entries = sum(int(r.xlen(name)) for name in names)
    return {
        "used_mb": round(used / MB, 2),
        "embedding_cache_mb": round(cache / MB, 2),
        "streams_mb": round(streams / MB, 2),
        "stream_entries": entries,
    }


def snapshot(stack: LocalStack) -> dict[str, Any]:
    procs: dict[str, ManagedProcess] = {p.name: p for p in stack.processes}
    return {
        "rss_mb": {name: rss_mb(procs[name].pid) for name in SERVICES},
        "redis": redis_mb(stack.settings),
    }


def ask_every_service(settings: Settings, tenant: str) -> None:
    """One request of each service for `tenant`, so that each loads the tenant's state."""
    client.search_stub(settings).Search(
        search_pb2.SearchRequest(tenant_id=tenant, query="read a file", limit=10), timeout=120
    )
    client.scorer_stub(settings).ScoreTools(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text="read a file", top_k=10), timeout=300
    )
    client.planner_stub(settings).SuggestDag(
        planner_pb2.SuggestDagRequest(tenant_id=tenant, intent="read a file"), timeout=300
    )


def wait_for_graph(settings: Settings, tenant: str, tools: int, timeout_s: float = 1800) -> None:
    """Until the trainer has written the tenant's tools and the scorer serves all of them."""
    stub = client.scorer_stub(settings)
    deadline = time.monotonic() + timeout_s
    while True:
        info = stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=300)
        if info.num_tools >= tools:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scorer serves {info.num_tools} of {tools} tools of {tenant}")
        time.sleep(2)


def load_tenant(settings: Settings, tenant: str, tools: int, console: Console) -> None:
    catalog = synthetic_catalog(tools)
    with counted_phase(console, f"registering {tools} tools under {tenant}", tools) as bar:
        for start in range(0, tools, client.REGISTER_BATCH):
            batch = catalog[start : start + client.REGISTER_BATCH]
            client.register_tools(settings, tenant, batch)
            bar.advance(len(batch))
    with phase(console, "waiting for the trainer's graph and the scorer's model"):
        wait_for_graph(settings, tenant, tools)
    ask_every_service(settings, tenant)


def restart(stack: LocalStack, names: tuple[str, ...]) -> None:
    for proc in [p for p in stack.processes if p.name in names]:
        stack.processes.remove(proc)
        proc.stop()
    stack.start_services(list(names))


def difference(after: dict[str, Any], before: dict[str, Any], per: int = 1) -> dict[str, Any]:
    return {
        part: {k: round((after[part][k] - before[part][k]) / per, 2) for k in after[part]}
        for part in after
    }


def bench_memory(tools: int, tenants: int, tenant_tools: int, console: Console) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pml-memory-") as tmp:
        stack = LocalStack.on_free_ports(Path(tmp))
        try:
            with phase(console, "starting a private PML (Redis, Neo4j, four services)"):
                stack.start_stores()
                stack.start_services(list(SERVICES))
            settings = stack.settings
            load_tenant(settings, f"warm-up-{uuid.uuid4().hex[:8]}", 5, console)
            warm = snapshot(stack)
            large = f"big-{uuid.uuid4().hex[:8]}"
            load_tenant(settings, large, tools, console)
            big = snapshot(stack)
            step(console, f"{tenants} tenants of {tenant_tools} tools each")
            for i in range(tenants):
                tenant = f"small-{i}-{uuid.uuid4().hex[:6]}"
                client.register_tools(settings, tenant, synthetic_catalog(tenant_tools))
                wait_for_graph(settings, tenant, tenant_tools)
                ask_every_service(settings, tenant)
            small = snapshot(stack)
            with phase(console, f"restarting {', '.join(CACHING)}"):
                restart(stack, CACHING)
            ask_every_service(settings, f"warm-up-{uuid.uuid4().hex[:8]}")
            restarted = snapshot(stack)
            ask_every_service(settings, large)
            reloaded = snapshot(stack)
        finally:
            with phase(console, "stopping the private PML"):
                stack.stop()
    return {
        "tools": tools,
        "warm": warm,
        "one_tenant": big,
        f"plus_{tenants}_tenants": small,
        "per_tenant_of_tools": difference(big, warm),
        f"per_tenant_of_{tenant_tools}_tools": difference(small, big, max(tenants, 1)),
        "restarted": restarted,
        "restarted_then_large_tenant_asked": reloaded,
        "held_per_tenant_of_tools": difference(reloaded, restarted),
    }
