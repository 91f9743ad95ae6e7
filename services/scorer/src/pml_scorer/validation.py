"""Validation of ScorerService requests: every rule that turns bad input into INVALID_ARGUMENT.

Each function returns the clean value or raises `RequestError` (via `invalid_argument`) with a
message naming the field and what is wrong, so a caller can fix the request from the message.
Tenant ids, texts and result counts follow the rules every service shares
(`pml_common.request_validation`); the rules here are the scorer's own fields.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from pml.v1 import scorer_pb2
from pml_common import input_rules
from pml_common.grpc_server import invalid_argument
from pml_common.request_validation import MAX_TEXT, text_of
from pml_common.settings import Settings

#: Longest path PredictPathSuccess scores (an execution has at most 1000 steps).
MAX_PATH = 1000
#: Deepest capability level a request may name (real hierarchies have a handful).
MAX_LEVEL = 100


def embedding_of(values: Sequence[float], dim: int) -> NDArray[np.float32]:
    if len(values) != dim:
        raise invalid_argument(
            f"embedding has {len(values)} values; this scorer's embeddings have {dim}"
        )
    vector = np.asarray(values, dtype=np.float32)
    if not np.isfinite(vector).all():
        raise invalid_argument("embedding holds NaN or infinite values")
    if not np.any(vector):
        raise invalid_argument("embedding is all zeros (it has no direction to score against)")
    return vector


def intent_of(
    request: scorer_pb2.ScoreRequest, settings: Settings, dim: int
) -> str | NDArray[np.float32]:
    """The request's intent: its text (to embed) or the embedding it gives directly."""
    which = request.WhichOneof("intent")
    if which == "text":
        return text_of(request.text, settings, "intent text")
    if which == "embedding":
        return embedding_of(request.embedding.values, dim)
    raise invalid_argument("intent must be given: set `text` or `embedding`")


def level_of(request: scorer_pb2.ScoreRequest) -> int | None:
    """The capability level to keep, or None for all levels."""
    if not request.HasField("level"):
        return None
    if not 0 <= request.level <= MAX_LEVEL:
        raise invalid_argument(f"level must be between 0 and {MAX_LEVEL}; got {request.level}")
    return request.level


def no_level(request: scorer_pb2.ScoreRequest) -> None:
    """ScoreTools: tools have no hierarchy level, so a level filter is a mistake."""
    if request.HasField("level"):
        raise invalid_argument("level applies to capabilities only; leave it unset for tools")


def path_of(path: Sequence[str]) -> list[str]:
    if len(path) > MAX_PATH:
        raise invalid_argument(f"path holds {len(path)} node ids; the maximum is {MAX_PATH}")
    bad = [
        i
        for i, node in enumerate(path)
        if not node.strip() or len(node) > MAX_TEXT or input_rules.has_control(node)
    ]
    if bad:
        shown = ", ".join(f"path[{i}]" for i in bad[:10])
        raise invalid_argument(
            f"path ids must be non-empty (at most {MAX_TEXT} characters, no control "
            f"characters); invalid: {shown}"
        )
    return list(path)
