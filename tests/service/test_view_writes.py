"""``store.views.write_view`` given the view the tables hold writes only what changed: what
``read_view`` then reads is the new view, whatever changed (a share's figures, types that came
or went, what could be placed), on SQLite and on PostgreSQL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sqlalchemy import Engine

from airflow_quota.store.engine import make_engine, migrate, session_factory
from airflow_quota.store.settings import normalize
from airflow_quota.store.views import Placeable, QuotaView, ShareView, TypeView, read_view, write_view


def _type(name: str, used: int, runnable: int = 0) -> TypeView:
    return TypeView(name, 1, 4, 4, used, 0, 0.0, 4 - used, runnable, 100.0 if runnable else None)


def _share(name: str, running: int, types: tuple[TypeView, ...], normal: float | None = None) -> ShareView:
    """A share whose threshold adapts: 8x its normal wait, 48 h while that is not known."""
    threshold = 172800.0 if normal is None else 8 * normal
    return ShareView(
        name,
        "LEND_AND_BORROW",
        "ENABLED",
        None,
        False,
        None,
        10,
        running,
        0,
        None,
        threshold,
        normal,
        False,
        8.0,
        types,
    )


def _fixed(name: str, types: tuple[TypeView, ...]) -> ShareView:
    """A share whose threshold is its ``starvation_after_seconds``: 1 h."""
    return ShareView(name, "LEND", "ENABLED", None, False, None, 10, 0, 0, None, 3600.0, None, True, None, types)


BEFORE = QuotaView(
    shares=(_share("a", 1, (_type("g5", 1), _type("p3", 0))), _fixed("b", (_type("g5", 0),))),
    placeable=(Placeable("a", "g5", None, 3, None), Placeable("b", "g5", "night", 0, "QUOTA")),
    computed_at=10.0,
)
AFTER = QuotaView(
    shares=(
        _share("a", 2, (_type("g5", 2, runnable=1),), normal=120.0),  # its normal wait known now: 16 min
        _fixed("b", (_type("g5", 0), _type("p3", 1))),
    ),
    placeable=(Placeable("a", "g5", None, 2, None), Placeable("a", "p3", None, 1, None)),
    computed_at=20.0,
)


def _round_trip(engine: Engine) -> None:
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        write_view(session, BEFORE)
    with sessions() as session:
        assert read_view(session) == BEFORE
    with sessions() as session, session.begin():
        write_view(session, AFTER, stored=BEFORE)
    with sessions() as session:
        stored = read_view(session)
    assert stored == AFTER
    assert stored.computed_at == 20.0
    unchanged = dataclasses.replace(AFTER, computed_at=30.0)
    with sessions() as session, session.begin():
        write_view(session, unchanged, stored=AFTER)
    with sessions() as session:
        assert read_view(session).computed_at == 30.0


def test_sqlite(tmp_path: Path) -> None:
    _round_trip(make_engine(f"sqlite:///{tmp_path / 'quota.db'}"))


def test_postgresql(postgres_url: str) -> None:
    engine = make_engine(normalize(postgres_url))
    try:
        _round_trip(engine)
    finally:
        engine.dispose()


def test_a_shares_starvation_threshold_in_words() -> None:
    """What ``airflow-quota shares`` prints (the Quotas page says the same, ``quotas.js``)."""
    assert _fixed("b", ()).starvation_words() == "after 1 hour (fixed)"
    assert _share("a", 0, ()).starvation_words() == "after 2 days (normal wait not known yet)"
    assert (
        _share("a", 0, (), normal=1440.0).starvation_words()
        == "after 3 hours 12 minutes (8x a normal wait of 24 minutes)"
    )
    at_least = dataclasses.replace(_share("a", 0, (), normal=30.0), starvation_threshold_seconds=7200.0)
    assert at_least.starvation_words() == "after 2 hours (the minimum; 8x a normal wait of 30 seconds is less)"
    unwritten = dataclasses.replace(_share("a", 0, ()), starvation_threshold_seconds=None, starvation_multiple=None)
    assert unwritten.starvation_words() == "not known yet (the quota scheduler has not written it since its upgrade)"
