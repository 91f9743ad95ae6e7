"""Weights of learned links (ADR-038 §2.3, from ADR-041), one definition for every service.

The trainer stores `weight = TYPE_WEIGHT[type] × SOURCE_MULTIPLIER[source] × factor` on every
link; the planner turns links into costs (`1 / weight`) with the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Structural strength of a link type.
TYPE_WEIGHT: Mapping[str, float] = {"dependency": 1.0, "contains": 0.8, "sequence": 0.5}
#: Trust in how the link was learned.
SOURCE_MULTIPLIER: Mapping[str, float] = {"observed": 1.0, "inferred": 0.7, "template": 0.5}


def edge_weight(edge_type: str, source: str, factor: float = 1.0) -> float:
    return TYPE_WEIGHT[edge_type] * SOURCE_MULTIPLIER[source] * factor
