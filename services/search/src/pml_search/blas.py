"""Limit the BLAS thread pool numpy uses, at run time.

The search hot path is one (n, dim) float32 matrix-vector product per query. At 10k tools a
single thread does it in well under 1 ms; OpenBLAS's default pool (one thread per core), whose
workers compete with gRPC's threads and the event loop on a 2-core pod, made it 6-8 ms at p50
and tens of ms at p99 (services/search/README.md). `OPENBLAS_NUM_THREADS` only works before
numpy loads, so the composition root also calls `limit_blas_threads` on the loaded library.
"""

from __future__ import annotations

import ctypes

import numpy  # noqa: F401  (the library must be loaded to be found)
import structlog

log = structlog.get_logger(__name__)

_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def _loaded_openblas() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    except OSError:  # not Linux: leave the pool alone
        return []


def limit_blas_threads(threads: int = 1) -> bool:
    """Set the OpenBLAS pool size of this process; False when no OpenBLAS is found."""
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(threads))
                log.debug("blas threads limited", library=path, threads=threads)
                return True
    return False
