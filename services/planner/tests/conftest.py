"""Fixtures of the planner's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .helpers import StandIns, serving_stand_ins


@pytest.fixture
async def stand_ins() -> AsyncIterator[StandIns]:
    """The scorer and search the planner calls, with fixed rankings (`StandIns.rank`)."""
    async with serving_stand_ins() as found:
        yield found
