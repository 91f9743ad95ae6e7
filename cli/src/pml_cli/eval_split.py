"""Folds of the K-fold evaluations, by query or by workflow.

- `query`: a seeded shuffle of the queries cut into K folds. Paraphrases of one task land in
  training and test alike, so a method that remembers past tasks scores well: this split
  measures memory as much as generalisation.
- `workflow`: queries are grouped by their gold tool set, and whole groups are assigned to
  folds, so no test query's tool set was ever seen in training. Two queries are in one group
  when they share a gold set, either their `relevant` set or the set of steps they ran
  (`sequence`, else `relevant`), transitively: what is learned from a training query (its steps,
  its co-used capability) then never names a test query's set. Groups are shuffled with the
  seed and placed largest first into the fold holding the fewest queries, so folds stay
  balanced and the split is deterministic.

`gold_seen` counts the test queries whose gold set some training query had: the share of a
split a pure lookup of past tasks could answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np

from pml_cli.eval_data import EvalError

SPLITS = ("query", "workflow")
SPLIT_SEED = 0


class GoldQuery(Protocol):
    @property
    def relevant(self) -> list[str]: ...

    @property
    def sequence(self) -> list[str] | None: ...


Q = TypeVar("Q", bound=GoldQuery)


def steps_of(query: GoldQuery) -> list[str]:
    """The tools a query ran, in order: its `sequence`, else `relevant`, repeats dropped."""
    return list(dict.fromkeys(query.sequence or query.relevant))


def gold_sets(query: GoldQuery) -> set[tuple[str, ...]]:
    """The query's gold tool sets, each as a sorted tuple: `relevant`, and the steps it ran."""
    return {tuple(sorted(set(query.relevant))), tuple(sorted(steps_of(query)))}


def fold_split(count: int, folds: int, seed: int = SPLIT_SEED) -> list[np.ndarray]:
    """Row numbers of each fold: a seeded shuffle of 0..count-1 cut into `folds` parts."""
    if folds < 2 or folds > count:
        raise EvalError(f"--folds must be between 2 and the number of queries ({count})")
    order = np.random.default_rng(seed).permutation(count)
    return list(np.array_split(order, folds))


def workflow_groups(queries: Sequence[GoldQuery]) -> list[list[int]]:
    """Row numbers of the queries sharing a gold set (transitively), by first row."""
    parent = list(range(len(queries)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_with: dict[tuple[str, ...], int] = {}
    for row, query in enumerate(queries):
        for gold in gold_sets(query):
            other = first_with.setdefault(gold, row)
            parent[root(row)] = root(other)
    groups: dict[int, list[int]] = {}
    for row in range(len(queries)):
        groups.setdefault(root(row), []).append(row)
    return list(groups.values())


def workflow_split(
    queries: Sequence[GoldQuery], folds: int, seed: int = SPLIT_SEED
) -> list[np.ndarray]:
    """Row numbers of each fold, whole workflow groups per fold (see the module docstring)."""
    groups = workflow_groups(queries)
    if folds < 2 or folds > len(groups):
        raise EvalError(
            f"--folds must be between 2 and the number of distinct gold tool sets ({len(groups)})"
        )
    shuffled = [groups[i] for i in np.random.default_rng(seed).permutation(len(groups))]
    # Stable: groups of one size keep the seeded order among themselves.
    shuffled.sort(key=len, reverse=True)
    rows: list[list[int]] = [[] for _ in range(folds)]
    for group in shuffled:
        smallest = min(range(folds), key=lambda f: len(rows[f]))
        rows[smallest].extend(group)
    return [np.array(sorted(r), dtype=np.int64) for r in rows]


def split_rows(
    queries: Sequence[GoldQuery], folds: int, split: str, seed: int = SPLIT_SEED
) -> list[np.ndarray]:
    if split == "query":
        return fold_split(len(queries), folds, seed)
    if split == "workflow":
        return workflow_split(queries, folds, seed)
    raise EvalError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


def train_test_folds(
    queries: Sequence[Q], folds: int, split: str = "query", seed: int = SPLIT_SEED
) -> list[tuple[list[Q], list[Q]]]:
    """(training queries, test queries) of every fold of the split."""
    parts = split_rows(queries, folds, split, seed)
    return [
        (
            [queries[i] for other, rows in enumerate(parts) if other != number for i in rows],
            [queries[i] for i in test_rows],
        )
        for number, test_rows in enumerate(parts)
    ]


def gold_seen(train: Sequence[GoldQuery], test: Sequence[GoldQuery]) -> int:
    """How many test queries share a gold set with some training query."""
    known = {gold for q in train for gold in gold_sets(q)}
    return sum(1 for q in test if gold_sets(q) & known)
