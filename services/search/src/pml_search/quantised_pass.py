"""The dense pass on 8-bit copies of the rows, with the float32 answer kept exact.

A request's dense pass reads every row of its tenant (`CosineBatches`); float32 rows of the
default tool embedder are 5 kB each. Each row is also kept as 8-bit codes, one scale per row
and model, a quarter of the bytes. onnxruntime's integer product (`MatMulInteger`, exact in
int32) reads those instead: the pass costs half at 10k rows and a third at 100k (measured in
process, docs/benchmarks.md).

The codes only choose which rows matter. Each approximate cosine comes with a bound on its
error. Every row whose bound leaves it a chance of reaching the answer is scored again in
float32 from the float32 rows: the top k, and each model's lowest and highest cosine, which the
first stage's min-max fusion reads (`exact_top`). So the answer and its scores are those of the
float32 pass, to float32 rounding, and the scorer's untrained first stage, which computes the
float32 cosines, still equals it.

Bounds, for a row x stored as x̂ and a query q: x·q − x̂·q̂ = (x − x̂)·q + x̂·(q − q̂), at most
‖x − x̂‖·‖q‖ + ‖x̂‖·‖q − q̂‖. The row's residual norm is kept with its codes. The query is
quantised in two planes (its codes, then the codes of what they missed), so its residual is
negligible. Queries use 63 levels, not 127: with 255 × 63 a pair of products stays within a
16-bit sum, so CPUs whose integer kernel adds pairs in 16 bits (AVX2 without VNNI) cannot
saturate it, and the product stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from pml_common.first_stage import part_cosines, part_spans
from pml_search.ranking import top_k_indices

#: Codes are stored as unsigned bytes around this zero point.
ZERO_POINT = 128
#: A row's codes span ±127 around the zero point.
ROW_LEVELS = 127
#: A query's codes span ±63 (see the module docstring: no 16-bit saturation).
QUERY_LEVELS = 63
#: Added to every bound: float32 rounding of the scaled products and of the float32 re-score.
ROUNDING = 1e-5


def integer_product_model() -> bytes:
    """An ONNX graph of one `MatMulInteger`: (n, d) uint8 codes times (d, m) int8 codes."""
    from onnx import TensorProto, helper

    node = helper.make_node("MatMulInteger", ["rows", "queries", "row_zero"], ["products"])
    graph = helper.make_graph(
        [node],
        "integer_product",
        [
            helper.make_tensor_value_info("rows", TensorProto.UINT8, ["n", "d"]),
            helper.make_tensor_value_info("queries", TensorProto.INT8, ["d", "m"]),
            helper.make_tensor_value_info("row_zero", TensorProto.UINT8, []),
        ],
        [helper.make_tensor_value_info("products", TensorProto.INT32, ["n", "m"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime releases since 1.10 read
    return bytes(model.SerializeToString())


class IntegerProduct:
    """Exact int32 products of uint8 rows and int8 queries, on one onnxruntime thread (the
    pass runs in a worker thread of its own; `run` may be called from several at once)."""

    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            integer_product_model(), options, providers=["CPUExecutionProvider"]
        )
        self._zero = np.array(ZERO_POINT, dtype=np.uint8)

    def __call__(self, rows: np.ndarray, queries: np.ndarray) -> np.ndarray:
        """(n, m) int32: Σ (rows − 128) · queries, `rows` (n, d) uint8, `queries` (m, d) int8."""
        feeds = {"rows": rows, "queries": np.ascontiguousarray(queries.T), "row_zero": self._zero}
        products: np.ndarray = self._session.run(None, feeds)[0]
        return products


@dataclass(frozen=True)
class RowCodes:
    """8-bit codes of rows of one model: x ≈ scale · (codes − 128), with the residual and the
    decoded row's norms that bound the error."""

    codes: np.ndarray  # (n, d) uint8
    scale: np.ndarray  # (n,) float32
    residual: np.ndarray  # (n,) float32: ‖x − x̂‖
    norm: np.ndarray  # (n,) float32: ‖x̂‖


def quantise_rows(rows: np.ndarray) -> RowCodes:
    rows = np.asarray(rows, dtype=np.float32)
    peak = np.abs(rows).max(axis=1) if rows.size else np.zeros(len(rows), np.float32)
    scale = np.where(peak > 0, peak / ROW_LEVELS, 1.0).astype(np.float32)
    levels = np.clip(np.rint(rows / scale[:, None]), -ROW_LEVELS, ROW_LEVELS)
    decoded = levels * scale[:, None]
    return RowCodes(
        codes=(levels + ZERO_POINT).astype(np.uint8),
        scale=scale,
        residual=np.linalg.norm(rows - decoded, axis=1).astype(np.float32),
        norm=np.linalg.norm(decoded, axis=1).astype(np.float32),
    )


def _query_planes(queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(2m, d) int8 codes of `m` queries in two planes, their (2m,) scales, and the (m,) norms
    of what the two planes together miss."""
    planes, scales, rest = [], [], np.asarray(queries, dtype=np.float64)
    for _ in range(2):
        peak = np.abs(rest).max(axis=1)
        scale = np.where(peak > 0, peak / QUERY_LEVELS, 1.0)
        levels = np.clip(np.rint(rest / scale[:, None]), -QUERY_LEVELS, QUERY_LEVELS)
        planes.append(levels.astype(np.int8))
        scales.append(scale)
        rest = rest - levels * scale[:, None]
    return np.concatenate(planes), np.concatenate(scales), np.linalg.norm(rest, axis=1)


@dataclass(frozen=True)
class Rows:
    """What a pass reads: each model's float32 rows and their codes (the first n rows)."""

    floats: Sequence[np.ndarray]
    codes: Sequence[RowCodes]

    def __len__(self) -> int:
        return len(self.floats[0]) if self.floats else 0


@dataclass(frozen=True)
class Approximate:
    """(models, m, n) approximate cosines of `m` queries with a pass's rows and (models, m, n)
    bounds on their error; `exact` re-scores chosen rows in float32."""

    rows: Rows
    queries: np.ndarray  # (m, dim) float32
    cosines: np.ndarray
    bounds: np.ndarray

    def columns(self, start: int, stop: int) -> Approximate:
        """The same for queries `start:stop` only."""
        return Approximate(
            self.rows,
            self.queries[start:stop],
            self.cosines[:, start:stop],
            self.bounds[:, start:stop],
        )

    def exact(self, which: np.ndarray) -> np.ndarray:
        """(models, m, len(which)) float32 cosines of rows `which`, as the float32 pass would
        give them (`part_cosines`)."""
        return part_cosines([rows[which] for rows in self.rows.floats], self.queries)


def approximate(rows: Rows, queries: np.ndarray, product: IntegerProduct) -> Approximate:
    """The pass: every row's approximate cosine with each query, from the codes.

    Cosines are those of `part_cosines`: an ensemble vector holds each model's unit vector
    scaled by 1/√k, so a slice's product times k is that model's cosine."""
    queries = np.asarray(queries, dtype=np.float32)
    k, m = len(rows.codes), len(queries)
    widths = [codes.codes.shape[1] for codes in rows.codes]
    if queries.ndim != 2 or queries.shape[1] != sum(widths):
        raise ValueError(f"queries of shape {queries.shape} for rows of {sum(widths)} columns")
    cosines, bounds = [], []
    for (start, width), codes in zip(part_spans(widths), rows.codes, strict=True):
        part = queries[:, start : start + width]
        planes, plane_scale, missed = _query_planes(part)
        products = product(codes.codes, planes).astype(np.float64)  # (n, 2m), exact
        decoded = (products[:, :m] * plane_scale[:m] + products[:, m:] * plane_scale[m:]).T
        cosines.append(k * codes.scale[None, :] * decoded)
        norm = np.linalg.norm(part, axis=1)
        bounds.append(
            k * (codes.residual[None, :] * norm[:, None] + codes.norm[None, :] * missed[:, None])
            + ROUNDING
        )
    if not cosines:
        empty = np.zeros((0, m, len(rows)), dtype=np.float32)
        return Approximate(rows, queries, empty, empty)
    return Approximate(
        rows, queries, np.stack(cosines).astype(np.float32), np.stack(bounds).astype(np.float32)
    )


#: What the first stage makes of (models, texts, n) cosines and each text's raw BM25 scores:
#: each row's relevance.
Relevance = Callable[[np.ndarray, Sequence[np.ndarray]], np.ndarray]
#: A bound on that relevance's error, from (models, texts, n) bounds on the cosines and each
#: (model, text)'s (models, texts) span of cosines (highest − lowest).
ErrorOf = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Top:
    """The `k` most relevant rows, best first, their relevance and their (models, texts, k)
    float32 cosines."""

    rows: np.ndarray
    relevance: np.ndarray
    cosines: np.ndarray


def exact_top(
    approx: Approximate,
    lexical: Sequence[np.ndarray],
    k: int,
    relevance: Relevance,
    error_of: ErrorOf,
) -> Top:
    """The rows of the `k` highest `relevance` of the float32 cosines. `relevance` must read
    each (model, text)'s cosines through their lowest and highest only (min-max) and each
    text's BM25 scores through their highest.

    1. The rows that may hold a (model, text)'s lowest or highest cosine are scored exactly:
       the true extremes are among them.
    2. The approximate cosines are clipped to those extremes (the true values lie within
       them), which gives `relevance` the true extremes, and `error_of` its error.
    3. Every row whose relevance could reach the k-th best lower bound is scored exactly; with
       the extremes and each text's best BM25 row, `relevance` over these rows alone is the
       relevance over all of them.
    """
    cosines, bounds = approx.cosines, approx.bounds
    n = cosines.shape[-1]
    if n == 0 or k <= 0:
        return Top(np.empty(0, np.int64), np.empty(0, np.float32), cosines[..., :0])
    low, high = cosines - bounds, cosines + bounds
    extremes = np.flatnonzero(
        (low <= high.min(axis=-1, keepdims=True)).any(axis=(0, 1))
        | (high >= low.max(axis=-1, keepdims=True)).any(axis=(0, 1))
    )
    exact_extremes = approx.exact(extremes)
    lowest, highest = exact_extremes.min(axis=-1), exact_extremes.max(axis=-1)
    if k >= n:
        chosen = np.arange(n)
    else:
        clipped = np.clip(cosines, lowest[..., None], highest[..., None])
        clipped[..., extremes] = exact_extremes
        estimate = relevance(clipped, lexical)
        error = error_of(bounds, highest - lowest)
        floor = np.partition(estimate - error, n - k)[n - k]
        chosen = np.flatnonzero(estimate + error >= floor)
    best_lexical = np.asarray([np.argmax(scores) for scores in lexical if len(scores)], np.int64)
    read = np.unique(np.concatenate([chosen, extremes, best_lexical]))
    exact = approx.exact(read)
    scores = relevance(exact, [scores[read] for scores in lexical])
    top = top_k_indices(scores, k)
    return Top(read[top], scores[top], exact[..., top])
