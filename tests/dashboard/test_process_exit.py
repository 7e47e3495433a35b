"""What the dashboard started is stopped once, the latest first, a failing cleanup not stopping the others."""

from __future__ import annotations

from kvlab.dashboard import process_exit


def test_every_cleanup_runs_once_latest_first_past_a_failing_one(monkeypatch):
    monkeypatch.setattr(process_exit, "_cleanups", [])
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("already gone")

    process_exit.stop_at_exit(lambda: ran.append("first"))
    process_exit.stop_at_exit(failing)
    process_exit.stop_at_exit(lambda: ran.append("last"))
    process_exit.stop_all()
    process_exit.stop_all()  # atexit after the lifespan: nothing runs twice
    assert ran == ["last", "failing", "first"]
