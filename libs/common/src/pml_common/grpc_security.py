"""TLS credentials and bearer-token authentication of PML's gRPC endpoints.

Both are off by default (plaintext, no token) for local runs, and turned on by settings only
(`tls_*`, `auth_*`; docs/operations.md, "Security"):

- TLS: servers present `tls_cert_file`/`tls_key_file`; clients verify them with `tls_ca_file`.
  Under mutual TLS (`tls_client_auth`) servers also require a client certificate signed by
  `tls_ca_file`, which clients present from the same `tls_cert_file`/`tls_key_file`.
- Tokens: with `auth_enabled`, `BearerTokenInterceptor` denies every RPC whose metadata lacks
  `authorization: Bearer <token>` naming an accepted token (UNAUTHENTICATED), before the request
  is even parsed. gRPC health and reflection stay open, so probes need no token. Clients send
  `auth_token` whenever it is set (`token_metadata`), through the interceptors below.

Tokens are compared in constant time (SHA-256 digests compared with `hmac.compare_digest`, so
neither content nor length leaks) and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import structlog

from pml_common.settings import Settings

log = structlog.get_logger("pml_common.grpc_security")

AUTHORIZATION = "authorization"
BEARER = "bearer"
#: Shortest token a server accepts: guessing one must be hopeless (`openssl rand -hex 32`).
MIN_TOKEN_CHARS = 16
#: Methods every caller may use without a token: probes (health) and tools (reflection).
PUBLIC_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_TOKEN_SEPARATORS = re.compile(r"[\s,]+")


class SecurityConfigError(ValueError):
    """The TLS or token settings cannot work; raised when a server or channel is built."""


# --- TLS ----------------------------------------------------------------------------------------


def _pem(path: str, setting: str) -> bytes:
    if not path:
        raise SecurityConfigError(f"{setting} must name a PEM file when TLS is enabled")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{setting}: cannot read {path!r} ({exc.strerror})") from exc


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """The server's TLS credentials, or None to serve plaintext (`tls_enabled` off)."""
    if not settings.tls_enabled:
        return None
    key = _pem(settings.tls_key_file, "tls_key_file")
    cert = _pem(settings.tls_cert_file, "tls_cert_file")
    if not settings.tls_client_auth:
        return grpc.ssl_server_credentials([(key, cert)])
    ca = _pem(settings.tls_ca_file, "tls_ca_file")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """A client's TLS credentials, or None for a plaintext channel (`tls_enabled` off).

    The client presents `tls_cert_file` when it is set (mutual TLS), and verifies servers with
    `tls_ca_file`, or the system's roots when that is empty.
    """
    if not settings.tls_enabled:
        return None
    ca = _pem(settings.tls_ca_file, "tls_ca_file") if settings.tls_ca_file else None
    if settings.tls_client_auth or settings.tls_cert_file:
        return grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=_pem(settings.tls_key_file, "tls_key_file"),
            certificate_chain=_pem(settings.tls_cert_file, "tls_cert_file"),
        )
    return grpc.ssl_channel_credentials(root_certificates=ca)


def tls_channel_options(settings: Settings) -> list[tuple[str, str]]:
    """Channel options of TLS: the name expected in the server's certificate, if overridden."""
    if settings.tls_enabled and settings.tls_server_name:
        return [("grpc.ssl_target_name_override", settings.tls_server_name)]
    return []


# --- tokens -------------------------------------------------------------------------------------


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def accepted_token_digests(settings: Settings) -> tuple[bytes, ...]:
    """Digests of every token a server accepts: `auth_token` and `auth_tokens`.

    Raises `SecurityConfigError` when auth is enabled without any token, or with one shorter
    than `MIN_TOKEN_CHARS` (the message names the setting, never the token).
    """
    named: list[tuple[str, str]] = []
    if settings.auth_token is not None:
        named.append(("auth_token", settings.auth_token.get_secret_value().strip()))
    if settings.auth_tokens is not None:
        raw = settings.auth_tokens.get_secret_value()
        named.extend(("auth_tokens", t) for t in _TOKEN_SEPARATORS.split(raw) if t)
    if not named:
        raise SecurityConfigError(
            "auth_enabled needs at least one accepted token: set auth_token or auth_tokens "
            "(or their *_file settings)"
        )
    short = sorted({setting for setting, token in named if len(token) < MIN_TOKEN_CHARS})
    if short:
        raise SecurityConfigError(
            f"tokens must have at least {MIN_TOKEN_CHARS} characters; too short in: "
            + ", ".join(short)
        )
    return tuple(dict.fromkeys(_digest(token) for _, token in named))


def bearer_token_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an `authorization: Bearer <token>` entry, or None when there is none."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION:
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == BEARER and token.strip():
            return token.strip()
    return None


def token_matches(token: str, accepted: Sequence[bytes]) -> bool:
    """Whether `token` is one of the accepted digests, in time independent of where it differs
    (every accepted digest is compared, so the time says nothing about which one is close)."""
    given = _digest(token)
    matched = False
    for digest in accepted:
        matched |= hmac.compare_digest(given, digest)
    return matched


def token_metadata(settings: Settings) -> tuple[tuple[str, str], ...]:
    """The metadata a client adds to every call: its bearer token when one is configured."""
    if settings.auth_token is None:
        return ()
    return ((AUTHORIZATION, f"Bearer {settings.auth_token.get_secret_value().strip()}"),)


# --- server side --------------------------------------------------------------------------------


def _denial(handler: Any, message: str) -> Any:
    """A handler of the same kind as `handler` that answers UNAUTHENTICATED.

    Its deserializer ignores the request bytes: an unauthenticated caller gets no parsing done.
    """

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kwargs: dict[str, Any] = {
        "request_deserializer": lambda _: None,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    return grpc.stream_stream_rpc_method_handler(deny, **kwargs)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """Deny by default: only calls carrying an accepted bearer token reach a servicer."""

    def __init__(self, accepted: Sequence[bytes]) -> None:
        if not accepted:
            raise SecurityConfigError("a token interceptor needs at least one accepted token")
        self._accepted = tuple(accepted)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(PUBLIC_SERVICES):
            return handler
        token = bearer_token_of(handler_call_details.invocation_metadata)
        if token is None:
            log.warning("grpc.unauthenticated", method=method, reason="no bearer token")
            return _denial(
                handler, "missing credentials: send metadata 'authorization: Bearer <token>'"
            )
        if not token_matches(token, self._accepted):
            log.warning("grpc.unauthenticated", method=method, reason="unknown token")
            return _denial(handler, "invalid bearer token")
        return handler


def server_interceptors(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    """The authentication interceptor when `auth_enabled`, else none."""
    if not settings.auth_enabled:
        return []
    if not settings.tls_enabled:
        log.warning(
            "grpc.auth_without_tls",
            hint="bearer tokens cross the network in clear; enable TLS unless the network "
            "encrypts traffic itself",
        )
    return [BearerTokenInterceptor(accepted_token_digests(settings))]


# --- client side --------------------------------------------------------------------------------


def _with_metadata(metadata: Any, extra: Sequence[tuple[str, str]]) -> list[tuple[str, Any]]:
    return [*(metadata or ()), *extra]


class AioTokenInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[misc, unused-ignore]
):
    """Adds the bearer token to every call of an aio channel."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def _details(self, details: Any) -> Any:
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=_with_metadata(details.metadata, self._metadata),
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _BlockingCallDetails(grpc.ClientCallDetails):  # type: ignore[misc, unused-ignore]
    def __init__(self, details: Any, metadata: list[tuple[str, Any]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class BlockingTokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc, unused-ignore]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc, unused-ignore]
):
    """Adds the bearer token to every call of a blocking channel (the `pml` command)."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def _details(self, details: Any) -> Any:
        return _BlockingCallDetails(details, _with_metadata(details.metadata, self._metadata))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)
