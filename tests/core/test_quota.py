"""Quota arithmetic per instance type (docs/model.md rule 4.0.1, the invariant): ``share_term``, ``holding_cap`` and the
running sums of ``TypeLedger``, checked against hand computation and against a rebuild from
scratch."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_quota.core.config import Share
from airflow_quota.core.quota import TypeLedger, holding_cap, share_term

G5 = "ml.g5.xlarge"


# -- share_term ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "limit", "lends", "expected"),
    [
        (0, 2, True, 0),
        (1, 2, True, 1),
        (3, 2, True, 3),
        (0, 2, False, 2),
        (1, 2, False, 2),
        (2, 2, False, 2),
        (3, 2, False, 3),
        (2, 0, True, 2),
        (2, 0, False, 2),
    ],
    ids=[
        "an idle lender takes nothing out of the pool",
        "a lender under its limit takes only what it uses",
        "a lender above its limit takes what it uses",
        "an idle non-lender keeps its whole limit out of reach",
        "a non-lender under its limit still keeps its whole limit",
        "a non-lender at its limit takes its limit",
        "a non-lender above its limit takes what it uses",
        "a lender without a limit takes what it uses",
        "a non-lender without a limit takes what it uses",
    ],
)
def test_share_term(usage: int, limit: int, lends: bool, expected: int) -> None:
    assert share_term(usage, limit, lends) == expected


# -- holding_cap --------------------------------------------------------------------------


def _share(strategy: str, limit: int, borrow_limit: int | None = None) -> Share:
    fields: dict[str, Any] = {"name": "s", "capacity_limits": {G5: limit}, "strategy": strategy}
    if borrow_limit is not None:
        fields["borrow_limit"] = borrow_limit
    return Share.model_validate(fields)


@pytest.mark.parametrize(
    ("strategy", "borrow_limit", "limit", "expected"),
    [
        ("RESERVE", None, 3, 3),
        ("LEND", None, 3, 3),
        ("LEND_AND_BORROW", None, 3, None),
        ("LEND_AND_BORROW", -1, 3, None),
        ("LEND_AND_BORROW", 0, 3, 3),
        ("LEND_AND_BORROW", 100, 3, 6),
        ("LEND_AND_BORROW", 50, 3, 4),
        ("LEND_AND_BORROW", 200, 1, 3),
        ("LEND_AND_BORROW", 100, 0, 0),
        ("LEND_AND_BORROW", -1, 0, None),
    ],
    ids=[
        "RESERVE holds at most its limit",
        "LEND holds at most its limit",
        "LEND_AND_BORROW without a borrow limit is unbounded (default -1)",
        "LEND_AND_BORROW with borrow_limit -1 is unbounded",
        "LEND_AND_BORROW with borrow_limit 0 holds its limit",
        "LEND_AND_BORROW with borrow_limit 100 holds twice its limit",
        "LEND_AND_BORROW with borrow_limit 50 on a limit of 3 holds 4 (4.5 rounded down)",
        "LEND_AND_BORROW with borrow_limit 200 on a limit of 1 holds 3 (the walkthrough's qs1)",
        "a percentage of a zero limit is zero",
        "unbounded borrowing on a type without a limit stays unbounded",
    ],
)
def test_holding_cap(strategy: str, borrow_limit: int | None, limit: int, expected: int | None) -> None:
    assert holding_cap(_share(strategy, max(limit, 1), borrow_limit), limit) == expected


# -- TypeLedger: hand-computed borrowed() and lendable() ---------------------------------


def _ledger(capacity: int, limits: dict[str, int], lends: dict[str, bool], usage: dict[str, int]) -> TypeLedger:
    ledger = TypeLedger(name=G5, capacity=capacity, gpus=1, price=1.0, limits=limits, lends=lends)
    ledger.usage = dict(usage)
    ledger.recompute()
    return ledger


# a: LEND_AND_BORROW, b: LEND, c: RESERVE
LENDS = {"a": True, "b": True, "c": False}


@pytest.mark.parametrize(
    ("capacity", "limits", "usage", "borrowed", "lendable"),
    [
        (6, {"a": 2, "b": 2, "c": 1}, {}, 0, 1 + 2 + 2),
        (6, {"a": 2, "b": 2, "c": 1}, {"a": 4}, 2, 1 + 0 + 2),
        (6, {"a": 2, "b": 2, "c": 1}, {"a": 4, "b": 1}, 2, 1 + 0 + 1),
        (6, {"a": 2, "b": 2, "c": 1}, {"a": 2, "b": 3, "c": 1}, 1, 1),
        (3, {"a": 1, "b": 1, "c": 1}, {"a": 2}, 1, 0 + 0 + 1),
        (2, {"c": 2}, {}, 0, 0),
        (2, {"c": 1}, {"c": 0, "x": 1}, 1, 1),
        (4, {"a": 1, "c": 1}, {"a": 3, "c": 1}, 2, 2),
    ],
    ids=[
        "empty pool: unassigned 1 plus the idle limits of a and b, not RESERVE c's",
        "a borrows 2: unassigned 1 plus b's idle 2",
        "b uses one of its 2: lendable shrinks by one",
        "b above its limit counts as borrowing; lenders have nothing idle",
        "the walkthrough: qs1 borrows qs2's instance, qs3's RESERVE instance is not lendable",
        "a RESERVE share's idle capacity is never lendable",
        "a share with no limit on the type borrows everything it uses",
        "a RESERVE share at its limit adds nothing; a borrower draws on the unassigned 2",
    ],
)
def test_borrowed_and_lendable(
    capacity: int, limits: dict[str, int], usage: dict[str, int], borrowed: int, lendable: int
) -> None:
    ledger = _ledger(capacity, limits, LENDS, usage)
    assert ledger.borrowed() == borrowed
    assert ledger.borrowed_total == borrowed
    assert ledger.lendable() == lendable


def test_reserve_share_turned_lender_makes_its_idle_capacity_lendable() -> None:
    """The same usage with c lending instead of reserving: c's idle instance becomes lendable
    (a control for the RESERVE cases above, which would pass if idle capacity were ignored)."""
    reserve = _ledger(3, {"a": 1, "b": 1, "c": 1}, LENDS, {"a": 2})
    lending = _ledger(3, {"a": 1, "b": 1, "c": 1}, {**LENDS, "c": True}, {"a": 2})
    assert lending.lendable() == reserve.lendable() + 1
    assert lending.pressure == reserve.pressure - 1


# -- TypeLedger: running sums equal a rebuild from scratch --------------------------------

SHARES = ["a", "b", "c", "x"]  # x has no limit on the type


def _snapshot(ledger: TypeLedger) -> tuple[int, int, int]:
    return ledger.pressure, ledger.used, ledger.borrowed_total


@st.composite
def ledgers_and_changes(draw: st.DrawFn) -> tuple[TypeLedger, list[tuple[str, int]]]:
    limits = {s: draw(st.integers(0, 3)) for s in ("a", "b", "c")}
    limits = {s: n for s, n in limits.items() if n}
    lends = {s: draw(st.booleans()) for s in SHARES}
    capacity = sum(limits.values()) + draw(st.integers(0, 3))
    ledger = TypeLedger(name=G5, capacity=capacity, gpus=1, price=1.0, limits=limits, lends=lends)
    ledger.recompute()
    usage = dict.fromkeys(SHARES, 0)
    changes = []
    for _ in range(draw(st.integers(1, 30))):
        share = draw(st.sampled_from(SHARES))
        delta = draw(st.integers(-usage[share], 4).filter(lambda d: d != 0))
        usage[share] += delta
        changes.append((share, delta))
    return ledger, changes


@settings(max_examples=200, deadline=None)
@given(ledgers_and_changes())
def test_change_usage_keeps_running_sums_equal_to_recompute(case: tuple[TypeLedger, list[tuple[str, int]]]) -> None:
    ledger, changes = case
    for share, delta in changes:
        ledger.change_usage(share, delta)
        rebuilt = copy.deepcopy(ledger)
        rebuilt.recompute()
        assert _snapshot(ledger) == _snapshot(rebuilt), f"after {share} {delta:+d}"
        # and against the formulas of docs/model.md rule 4.0.1 directly
        names = set(ledger.limits) | set(ledger.usage)
        assert ledger.used == sum(ledger.usage.values())
        assert ledger.borrowed_total == sum(max(0, ledger.usage_of(s) - ledger.limit_of(s)) for s in names)
        assert ledger.pressure == sum(
            share_term(ledger.usage_of(s), ledger.limit_of(s), ledger.lends.get(s, True)) for s in names
        )
        assert ledger.below_limit == {s for s in names if ledger.usage_of(s) < ledger.limit_of(s)}


def test_change_usage_by_hand() -> None:
    """a (lends, limit 1) borrows one, c (RESERVE, limit 1) runs one: each step by hand."""
    ledger = _ledger(3, {"a": 1, "b": 1, "c": 1}, LENDS, {})
    assert _snapshot(ledger) == (1, 0, 0)  # c's reserved idle instance
    ledger.change_usage("a", 2)
    assert _snapshot(ledger) == (3, 2, 1)
    ledger.change_usage("c", 1)
    assert _snapshot(ledger) == (3, 3, 1)  # c's term was already its limit
    ledger.change_usage("a", -2)
    assert _snapshot(ledger) == (1, 1, 0)
