import numpy as np
import pytest

from pml_shgat import adapter as query_adapter
from pml_shgat.adapter import QueryAdapter
from pml_shgat.params import init_params, make_config, read_version, to_bytes


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _ensemble(*models: np.ndarray) -> np.ndarray:
    """Each model's unit rows scaled by 1/√k, side by side (the tool embedder's layout)."""
    return np.hstack([_unit(m) / np.sqrt(len(models)) for m in models]).astype(np.float32)


def _worded_apart(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Requests worded away from their tools: each request is its tool's vector turned by a
    fixed rotation of most of its weight (the tenant's wording), plus noise."""
    tools = rng.standard_normal((40, 16))
    rotation, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    executed = [int(t) for t in rng.integers(0, 40, n)]
    requests = (
        0.3 * tools[executed] + tools[executed] @ rotation + 0.1 * rng.standard_normal((n, 16))
    )
    return requests, tools, executed


def _top1(requests: np.ndarray, tools: np.ndarray, executed: list[int]) -> float:
    return float(np.mean(np.argmax(_unit(requests) @ _unit(tools).T, axis=1) == executed))


def test_the_adapter_learns_the_wording_of_requests_and_ranks_unseen_ones_better() -> None:
    rng = np.random.default_rng(0)
    requests, tools, executed = _worded_apart(rng, 300)
    catalog = _ensemble(tools, tools)
    fitted = query_adapter.fit(
        _ensemble(requests[:200], requests[:200]),
        [[t] for t in executed[:200]],
        catalog,
        (16, 16),
        rng,
    )
    assert fitted is not None and fitted.parts == (16, 16)
    # the 100 requests it did not learn from, each model's half mapped by its own map
    held = _ensemble(requests[200:], requests[200:])
    adapted = fitted.adapt(held)
    before = _top1(held[:, :16], tools, executed[200:])
    after = _top1(adapted[:, :16], tools, executed[200:])
    assert after > before + 0.2
    # the layout is kept: each model's slice a unit vector scaled by 1/√2
    norms = np.linalg.norm(adapted[:, :16], axis=1)
    assert norms == pytest.approx(np.full(100, 1 / np.sqrt(2)), abs=1e-5)


def test_no_executed_catalog_tool_teaches_nothing() -> None:
    rng = np.random.default_rng(1)
    catalog = _ensemble(rng.standard_normal((5, 4)))
    assert query_adapter.fit(catalog[:2], [[], []], catalog, (4,), rng) is None


def test_a_large_catalog_is_read_through_a_sample_holding_the_executed_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(query_adapter, "MAX_TOOLS", 8)
    columns = query_adapter._columns([[3, 17], [17, 29]], [0, 1], 30, np.random.default_rng(2))
    assert len(columns) == 8 and {3, 17, 29} <= set(columns.tolist())
    assert len(set(columns.tolist())) == 8


def test_the_adapter_travels_in_the_version_bytes() -> None:
    rng = np.random.default_rng(3)
    maps = (
        np.eye(4, dtype=np.float32) + 0.01 * rng.standard_normal((4, 4)).astype(np.float32),
        np.eye(2, dtype=np.float32),
    )
    adapter = QueryAdapter(maps, (4, 2))
    features = rng.standard_normal((6, 6))
    config = make_config(6, 4, 6)
    params = init_params(config, features, 0)
    version = read_version(to_bytes(config, params, adapter.to_arrays()))
    assert version.memory is None and version.adapter is not None
    assert version.adapter.parts == (4, 2)
    for kept, original in zip(version.adapter.maps, maps, strict=True):
        assert kept == pytest.approx(original, abs=1e-3)  # stored as W − I in float16
    assert read_version(to_bytes(config, params)).adapter is None
    broken = {**adapter.to_arrays(), "adapter/1": np.zeros((3, 3), np.float16)}
    with pytest.raises(ValueError, match="query adapter"):
        read_version(to_bytes(config, params, broken))


def _full_gradient(
    w: np.ndarray, x: np.ndarray, tools: np.ndarray, executed: list[int]
) -> np.ndarray:
    """The gradient of the module's objective over every map W (width² unknowns)."""
    targets = np.zeros((len(x), len(tools)))
    targets[np.arange(len(x)), executed] = 1.0
    logits = (x @ w) @ tools.T / query_adapter.TEMPERATURE
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    residual = (p - targets) / (len(x) * query_adapter.TEMPERATURE)
    gradient: np.ndarray = x.T @ (residual @ tools) + 2 * query_adapter.RIDGE * (w - np.eye(len(w)))
    return gradient


def test_the_map_minimises_the_objective_over_every_map() -> None:
    """Fitted in the span of the requests and the tools (fewer requests than dimensions here),
    the map is still the minimiser over all maps: the full gradient vanishes there."""
    rng = np.random.default_rng(2)
    requests, tools, executed = _worded_apart(rng, 12)
    x, catalog = _unit(requests), _unit(tools)
    fitted = query_adapter.fit(x, [[t] for t in executed], catalog, (16,), rng)
    assert fitted is not None
    at_identity = np.abs(_full_gradient(np.eye(16), x, catalog, executed)).max()
    at_map = np.abs(_full_gradient(fitted.maps[0].astype(np.float64), x, catalog, executed)).max()
    assert at_identity > 0.01
    assert at_map < 1e-3 * at_identity
