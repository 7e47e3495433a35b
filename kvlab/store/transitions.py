"""What a write transaction does to rows beyond its own table, shared by the store's parts (the repository and
the tune queries): an event logged, an experiment ended once its last trial has.  Each runs inside the
caller's session, so it commits or rolls back with the change that caused it."""

from __future__ import annotations

import time
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kvlab.secrets import redact
from kvlab.store.records import LEVELS, TERMINAL_STATUSES
from kvlab.store.tables import EventRow, ExperimentRow, TrialRow, TuneRow

#: Trial statuses of work not yet ended.
ACTIVE = ("queued", "running")
#: Trial statuses whose work was stopped (a cancel; a failure, stale recovery's included): they take no more
#: item results, so that nothing a worker still makes counts after the cancel (Store.add_item_result).
ENDED_WITHOUT_RESULTS = ("cancelled", "failed")


def add_event(session: Session, experiment_id: int, message: str, level: str = "info",
           trial_id: int | None = None) -> None:
    if level not in LEVELS:
        raise ValueError(f"event level {level!r}: one of {', '.join(LEVELS)}")
    session.add(EventRow(experiment_id=experiment_id, trial_id=trial_id, ts=time.time(), level=level,
                         message=redact(message)))


def roll_up(session: Session, experiment: ExperimentRow, now: datetime) -> None:
    """Once no trial is queued or running, the experiment ends: failed if any trial failed,
    else cancelled if any was cancelled, else done."""
    if experiment.status in TERMINAL_STATUSES or tune_is_running(session, experiment.id):
        return
    counts = dict(session.execute(select(TrialRow.status, func.count()).where(
        TrialRow.experiment_id == experiment.id).group_by(TrialRow.status)).all())
    if not counts or any(status in counts for status in ACTIVE):
        return
    total = sum(counts.values())
    if counts.get("failed"):
        experiment.status = "failed"
        experiment.error = f"{counts['failed']} of {total} trials failed"
    elif counts.get("cancelled"):
        experiment.status = "cancelled"
    else:
        experiment.status = "done"
    experiment.finished_at = now
    add_event(session, experiment.id, f"experiment {experiment.status}" + (f": {experiment.error}"
              if experiment.status == "failed" else ""), level="error" if experiment.status == "failed" else "info")


def tune_is_running(session: Session, experiment_id: int) -> bool:
    """True while a driver may still add trials: the experiment must not end between rounds."""
    return session.scalar(select(TuneRow.state).where(TuneRow.experiment_id == experiment_id)) == "running"

