"""Process lifecycle shared by every service's composition root."""

from __future__ import annotations

import asyncio
import signal


async def wait_for_shutdown_signal() -> signal.Signals:
    """Return once SIGTERM or SIGINT arrives (Kubernetes stops pods with SIGTERM)."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _resolve, received, sig)
    try:
        return await received
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _resolve(received: asyncio.Future[signal.Signals], sig: signal.Signals) -> None:
    if not received.done():
        received.set_result(sig)
