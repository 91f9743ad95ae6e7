"""A synthetic tool/capability hierarchy with intents, for tests, evaluation and benchmarks.

Tools cluster by topic; level-0 capabilities group 2–4 tools, level-1 capabilities group
level-0 ones, and capabilities have no text of their own (their input embedding is the mean of
their children). Intents are phrased "in other words": each intent mixes the capability's
direction with a fixed rotation of it, plus noise, the way users' words differ from tool
descriptions. Cosine similarity sees only part of the signal; a learned intent projection can
recover the rest, and the hierarchy tells which tools go together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pml_shgat.hierarchy import CapabilityInput, Hierarchy, normalise_rows


@dataclass(frozen=True)
class SyntheticQuery:
    intent: NDArray[np.float64]
    capability: str
    tools: tuple[str, ...]


@dataclass(frozen=True)
class SyntheticTask:
    tools: dict[str, NDArray[np.float64]]
    capabilities: list[CapabilityInput]
    train: list[SyntheticQuery]
    test: list[SyntheticQuery]

    def hierarchy(self) -> Hierarchy:
        return Hierarchy.build(self.tools, self.capabilities)


def synthetic_task(
    *,
    tools: int = 120,
    capabilities: int = 60,
    meta_capabilities: int = 10,
    dim: int = 32,
    topics: int = 12,
    train_per_capability: int = 4,
    test_per_capability: int = 2,
    literal_share: float = 0.5,
    noise: float = 0.35,
    seed: int = 0,
) -> SyntheticTask:
    rng = np.random.default_rng(seed)
    centres = normalise_rows(rng.standard_normal((topics, dim)))
    topic_of = rng.integers(0, topics, size=tools)
    tool_vectors = normalise_rows(centres[topic_of] + 0.6 * rng.standard_normal((tools, dim)))
    tool_ids = [f"synth:tool{i}" for i in range(tools)]
    caps: list[CapabilityInput] = []
    members: dict[str, tuple[str, ...]] = {}
    for c in range(capabilities):
        size = int(rng.integers(2, 5))
        chosen = tuple(tool_ids[i] for i in rng.choice(tools, size=size, replace=False))
        caps.append(CapabilityInput(id=f"cap{c}", embedding=None, tools=chosen))
        members[f"cap{c}"] = chosen
    for m in range(meta_capabilities):
        children = [f"cap{i}" for i in rng.choice(capabilities, size=2, replace=False)]
        caps.append(CapabilityInput(id=f"meta{m}", embedding=None, capabilities=children))
        members[f"meta{m}"] = tuple(dict.fromkeys(t for c in children for t in members[c]))
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    index = {t: i for i, t in enumerate(tool_ids)}
    queries: dict[str, list[SyntheticQuery]] = {"train": [], "test": []}
    for cap in caps:
        rows = [index[t] for t in members[cap.id]]
        direction = normalise_rows(tool_vectors[rows].mean(0)[None, :])[0]
        for split, count in (("train", train_per_capability), ("test", test_per_capability)):
            for _ in range(count):
                mixed = literal_share * direction + (1 - literal_share) * rotation @ direction
                noisy = mixed + noise * rng.standard_normal(dim) / np.sqrt(dim)
                intent = normalise_rows(noisy[None, :])[0]
                queries[split].append(SyntheticQuery(intent, cap.id, members[cap.id]))
    return SyntheticTask(
        tools=dict(zip(tool_ids, tool_vectors, strict=True)),
        capabilities=caps,
        train=queries["train"],
        test=queries["test"],
    )
