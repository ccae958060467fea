"""A part of the test stack that is missing (PostgreSQL, Chromium) skips on a developer's machine
and fails under CI=true, where a skip would hide a suite that never ran."""

from __future__ import annotations

import pytest

import tests.conftest as shared


def test_a_missing_part_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL"):
        shared.missing("no PostgreSQL server here")


def test_a_missing_part_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match=r"no PostgreSQL server here \(CI=true"):
        shared.missing("no PostgreSQL server here")
