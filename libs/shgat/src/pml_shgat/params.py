"""SHGAT parameters: their shapes, their initial values, and their bytes in the model registry.

Parameters are node-agnostic (shared matrices, no per-node row), so one trained version scores
tools and capabilities that appeared after it was trained.

    W_intent            (d, d)        intent projection
    W_q, W_k            (K·d_h, d)    the K heads' query/key projections, stacked
    W_child/k, a_up/k   (d, d), (2d)  upward message passing into level-k capabilities
    W_parent/k, a_down/k (d, d), (2d) downward message passing from level-k capabilities

Initial values make the untrained model rank like cosine similarity: W_intent = I, attention
vectors 0 (children averaged), W_q = W_k = a scaled orthonormal basis of the nodes' principal
directions, so Q·K approximates the cosine inside the key space.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from pml_shgat.adapter import QueryAdapter, is_adapter_array
from pml_shgat.memory import MemoryRanker, is_memory_array

FloatArray = NDArray[np.float64]
Params = dict[str, FloatArray]

#: Logit of a perfect cosine match at initialisation: sigmoid(10·cos) separates candidates.
INITIAL_TEMPERATURE = 10.0
#: Weight of messages relative to a node's own embedding at initialisation.
INITIAL_MESSAGE_GAIN = 0.5
#: Levels with parameters of their own; deeper levels share the last one's (a pathological
#: 1000-level chain must not allocate 1000 pairs of d×d matrices).
MAX_PARAMETER_LEVELS = 8


def level_slot(level: int) -> int:
    """Index of the parameters used by hierarchy level `level`."""
    return min(level, MAX_PARAMETER_LEVELS - 1)


@dataclass(frozen=True)
class ShgatConfig:
    dim: int
    key_dim: int
    heads: int

    @property
    def head_dim(self) -> int:
        return self.key_dim // self.heads

    @property
    def logit_scale(self) -> float:
        """1/(K·√d_h): `mean_h(Q_h·K_h)/√d_h` on the stacked heads is one dot product times it."""
        return 1.0 / (self.heads * float(np.sqrt(self.head_dim)))


def heads_for(num_nodes: int) -> int:
    """K adaptive heads from the graph size (seed 000: 4–16)."""
    if num_nodes < 500:
        return 4
    if num_nodes < 5000:
        return 8
    return 16


def make_config(dim: int, key_dim: int, num_nodes: int) -> ShgatConfig:
    """Heads from the graph size; keys no wider than the embeddings, split evenly."""
    heads = heads_for(num_nodes)
    width = min(key_dim, dim)
    width -= width % heads
    if width < heads:
        raise ValueError(f"embeddings of size {dim} are too small for {heads} heads")
    return ShgatConfig(dim=dim, key_dim=width, heads=heads)


def init_params(config: ShgatConfig, features: FloatArray, levels: int) -> Params:
    basis = _key_basis(features, config.key_dim, config.dim)
    gain = np.sqrt(INITIAL_TEMPERATURE / config.logit_scale)
    params: Params = {
        "W_intent": np.eye(config.dim),
        "W_q": gain * basis,
        "W_k": gain * basis,
    }
    return ensure_levels(params, config, levels)


def untrained_like(config: ShgatConfig, features: FloatArray, params: Params) -> Params:
    """The untrained parameters of a hierarchy with `features`, shaped as `params`: the levels
    `params` has, and each key row (`W_q`, `W_k`: the basis of `init_params`) with the sign of
    the same row in `params` — a key direction is the same either way round, and a model may
    have started from the other sign (a hierarchy that changed since, or a basis computed before
    its sign was fixed)."""
    untrained = ensure_levels(init_params(config, features, 0), config, num_levels(params))
    for name in ("W_q", "W_k"):
        basis = untrained[name]
        signs = np.where(np.sum(basis * params[name], axis=1) < 0, -1.0, 1.0)
        untrained[name] = basis * signs[:, None]
    return untrained


def ensure_levels(params: Params, config: ShgatConfig, levels: int) -> Params:
    """Add initial parameters for levels a deeper hierarchy has and the model has not."""
    grown = dict(params)
    for k in range(num_levels(params), min(levels, MAX_PARAMETER_LEVELS)):
        grown[f"W_child/{k}"] = INITIAL_MESSAGE_GAIN * np.eye(config.dim)
        grown[f"a_up/{k}"] = np.zeros(2 * config.dim)
        grown[f"W_parent/{k}"] = INITIAL_MESSAGE_GAIN * np.eye(config.dim)
        grown[f"a_down/{k}"] = np.zeros(2 * config.dim)
    return grown


def num_levels(params: Params) -> int:
    return sum(1 for name in params if name.startswith("W_child/"))


def to_bytes(
    config: ShgatConfig, params: Params, extra: Mapping[str, NDArray[np.generic]] | None = None
) -> bytes:
    """The version's bytes: config, parameters and `extra` arrays published with them (the
    execution memory, `pml_shgat.memory`, and the query adapter, `pml_shgat.adapter`, which
    `from_bytes` leaves out)."""
    buffer = io.BytesIO()
    header = np.frombuffer(json.dumps(asdict(config)).encode(), dtype=np.uint8)
    arrays: dict[str, NDArray[np.generic]] = {"__config__": header, **params, **(extra or {})}
    np.savez_compressed(buffer, allow_pickle=False, **arrays)
    return buffer.getvalue()


def from_bytes(blob: bytes) -> tuple[ShgatConfig, Params]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
        config = ShgatConfig(**json.loads(archive["__config__"].tobytes().decode()))
        params = {
            name: archive[name].astype(np.float64)
            for name in archive.files
            if not is_memory_array(name) and not is_adapter_array(name)
        }
    params.pop("__config__")
    _check_shapes(config, params)
    return config, params


@dataclass(frozen=True)
class Version:
    """A published version as served: SHGAT's config and parameters, and the corrections
    learned beside it (each None in a version without it)."""

    config: ShgatConfig
    params: Params
    memory: MemoryRanker | None
    adapter: QueryAdapter | None


def read_version(blob: bytes) -> Version:
    """A published version's parts; raises on bytes that do not hold a usable version."""
    config, params = from_bytes(blob)
    with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
        memory = {name: archive[name] for name in archive.files if is_memory_array(name)}
        adapter = {name: archive[name] for name in archive.files if is_adapter_array(name)}
    return Version(
        config, params, MemoryRanker.from_arrays(memory), QueryAdapter.from_arrays(adapter)
    )


def _check_shapes(config: ShgatConfig, params: Params) -> None:
    d, kd = config.dim, config.key_dim
    expected: dict[str, tuple[int, ...]] = {"W_intent": (d, d), "W_q": (kd, d), "W_k": (kd, d)}
    for k in range(num_levels(params)):
        expected |= {f"W_child/{k}": (d, d), f"W_parent/{k}": (d, d)}
        expected |= {f"a_up/{k}": (2 * d,), f"a_down/{k}": (2 * d,)}
    for name, shape in expected.items():
        if name not in params or params[name].shape != shape:
            raise ValueError(f"model parameter {name!r} missing or not of shape {shape}")


def _key_basis(features: FloatArray, key_dim: int, dim: int) -> FloatArray:
    """`key_dim` orthonormal rows: the nodes' top principal directions, completed if needed.

    Directions are taken without centring, so the mean direction (which cosine sees) is kept.
    They are the eigenvectors of the d × d Gram matrix (the right singular vectors, at a cost
    linear in the nodes: a tenant's every training round builds its untrained model, to pull
    toward it), each signed so that its largest component is positive.
    The completion uses a fixed seed: two trainers build the same initial model.
    """
    rows = np.zeros((0, dim))
    if len(features):
        values, vectors = np.linalg.eigh(features.T @ features)
        top = np.argsort(values)[::-1][: min(key_dim, len(features), dim)]
        rows = vectors[:, top].T
        rows *= np.sign(rows[np.arange(len(rows)), np.abs(rows).argmax(axis=1)])[:, None]
    if len(rows) < key_dim:
        filler = np.random.default_rng(0).standard_normal((key_dim - len(rows), dim))
        filler -= filler @ rows.T @ rows
        q, _ = np.linalg.qr(filler.T)
        rows = np.vstack([rows, q.T[: key_dim - len(rows)]])
    return np.asarray(rows, dtype=np.float64)
