"""The untrained model's key basis: the nodes' principal directions, with a fixed sign."""

from __future__ import annotations

import numpy as np

from pml_shgat.params import init_params, make_config


def test_the_key_basis_is_the_top_right_singular_vectors_signed_by_their_largest_part() -> None:
    rng = np.random.default_rng(0)
    # distinct singular values, so the directions are unique up to sign
    features = rng.standard_normal((300, 32)) * np.linspace(3.0, 0.5, 32)
    config = make_config(32, 8, len(features))
    basis = init_params(config, features, 1)["W_q"]
    basis = basis / np.linalg.norm(basis, axis=1, keepdims=True)
    _, _, vt = np.linalg.svd(features, full_matrices=False)
    assert np.allclose(np.abs(np.sum(basis * vt[:8], axis=1)), 1.0, atol=1e-6)
    largest = basis[np.arange(8), np.abs(basis).argmax(axis=1)]
    assert np.all(largest > 0)
