"""bench.dropping: a drop refused while autovacuum is on the database is tried
again; any other failure is raised at once."""

from __future__ import annotations

import pytest

from bench.dropping import AUTOVACUUM_REFUSAL, drop_retrying


def test_retries_only_while_autovacuum_holds_the_database() -> None:
    sent: list[str] = []

    def execute(sql: str) -> None:
        sent.append(sql)
        if len(sent) < 3:
            raise RuntimeError(f"permission denied: {AUTOVACUUM_REFUSAL} whose process ...")

    drop_retrying(execute, "scratch", pause_seconds=0)
    assert sent == ['DROP DATABASE IF EXISTS "scratch" WITH (FORCE)'] * 3


def test_other_failures_and_the_last_attempt_raise() -> None:
    def refused(sql: str) -> None:
        raise RuntimeError(AUTOVACUUM_REFUSAL)

    def broken(sql: str) -> None:
        raise RuntimeError("database is being accessed by other users")

    with pytest.raises(RuntimeError, match="other users"):
        drop_retrying(broken, "scratch", pause_seconds=0)
    with pytest.raises(RuntimeError, match="member of the role"):
        drop_retrying(refused, "scratch", attempts=2, pause_seconds=0)
