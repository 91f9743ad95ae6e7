"""Every gRPC channel of the code base is opened by `pml_common.grpc_client` and every server
is a `pml_common.grpc_server.GrpcServer`, so every client (services calling services, the `pml`
command, the health check) and every endpoint follows the TLS and token settings. A channel or
server made anywhere else would silently speak plaintext without a token."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_GLOBS = ("libs/*/src/**/*.py", "services/*/src/**/*.py", "cli/src/**/*.py")
CHANNEL_FACTORIES = {"insecure_channel", "secure_channel", "intercept_channel"}
SERVER_MODULE = "libs/common/src/pml_common/grpc_server.py"
#: Where opening a channel is the point, and why elsewhere is allowed.
ALLOWED = {
    "libs/common/src/pml_common/grpc_client.py": "the one place channels are opened",
    # Its own in-process server, which it runs in plaintext without a token (see there).
    "cli/src/pml_cli/bench_scorer.py": "a private loopback server of the benchmark",
}


def channel_openings(source: str) -> list[int]:
    """Lines of `grpc[.aio].<factory>(…)` calls in `source`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CHANNEL_FACTORIES
            and ast.unparse(node.func.value) in {"grpc", "grpc.aio"}
        ):
            lines.append(node.lineno)
    return lines


def test_channels_are_opened_by_grpc_client_only() -> None:
    found = []
    for pattern in SOURCE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            if relative in ALLOWED:
                continue
            found += [f"{relative}:{line}" for line in channel_openings(path.read_text())]
    assert found == [], "open channels with pml_common.grpc_client instead: " + ", ".join(found)


def server_creations(source: str) -> list[int]:
    """Lines of `grpc[.aio].server(…)` calls in `source`."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "server"
        and ast.unparse(node.func.value) in {"grpc", "grpc.aio"}
    ]


def test_servers_are_grpc_servers_only() -> None:
    found = []
    for pattern in SOURCE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            if relative == SERVER_MODULE:
                assert server_creations(path.read_text()), "the scan no longer sees GrpcServer's"
                continue
            found += [f"{relative}:{line}" for line in server_creations(path.read_text())]
    assert found == [], "serve with pml_common.grpc_server.GrpcServer instead: " + ", ".join(found)


def test_the_scan_finds_channel_openings() -> None:
    source = (
        "import grpc\n"
        "a = grpc.insecure_channel('x:1')\n"
        "b = grpc.aio.secure_channel('x:1', creds)\n"
        "c = other.insecure_channel('x:1')\n"
    )
    assert channel_openings(source) == [2, 3]
    assert channel_openings((ROOT / next(iter(ALLOWED))).read_text())
