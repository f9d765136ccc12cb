"""Fixtures shared by the data-side tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_local_search(monkeypatch):
    """Planner v2's stage-1 local search off (tests/plan/test_plan_search.py tests it). For the tests of the
    sampler's bookkeeping (lists, positions, threads), which does not depend on which plan the planner picks, it
    only costs time; tests/data/test_sampler_properties.py runs the sampler with the default planner."""
    monkeypatch.setattr("fcp_data.plan.search.SEARCH_MAX_SEQUENCES", 0)
