"""Limit the BLAS thread pool numpy uses, at run time.

The search hot path is one (n, dim) float32 matrix-vector product per query. At 10k tools a
single thread does it in well under 1 ms; OpenBLAS's default pool (one thread per core), whose
workers compete with gRPC's threads and the event loop on a 2-core pod, made it 6-8 ms at p50
and tens of ms at p99 (services/search/README.md). Environment variables only work before
numpy loads, so the composition root limits the loaded library with threadpoolctl.
"""

from __future__ import annotations

import structlog
from threadpoolctl import threadpool_limits

log = structlog.get_logger(__name__)


def limit_blas_threads(threads: int = 1) -> None:
    """Cap every loaded BLAS library of this process at `threads` threads."""
    threadpool_limits(limits=threads, user_api="blas")
    log.info("blas threads limited", threads=threads)
