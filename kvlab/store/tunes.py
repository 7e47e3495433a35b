"""The store's side of ``kvlab tune``: the search's row, its candidates, and trials that grow by rounds.

A tune is an ordinary experiment whose trials arrive round by round: the driver adds candidates
as trials limited to their first N items (``item_limit``), raises the limit of the promising ones
(they go back to the queue, and the worker skips the items they already have), and records its
verdict on each (:class:`~kvlab.store.tables.TuneCandidateRow`).  Any worker runs these trials like
any others.  While the tune runs, the experiment stays open between rounds; the driver closes it.

The tune's Optuna study lives beside the store, never in its tables: Optuna's RDB storage has tables
named ``trials`` and ``alembic_version`` -- the same names as kvlab's -- so on SQLite it lives in a
sibling file (``db/kvlab.sqlite`` -> ``db/kvlab.optuna.sqlite``), on PostgreSQL in its own schema of the
same database (``<kvlab's schema>_optuna``, ``kvlab_optuna`` beside ``public``).  Both servers' users
thus need nothing new, and a tune resumes, or is served by many hosts, wherever its store is.

:class:`TuneQueries` is mixed into :class:`kvlab.store.repository.Store`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine, func, insert, select, text, update

from kvlab.store.errors import ExperimentNotFoundError, StoreError
from kvlab.store.records import CANDIDATE_STATES, TERMINAL_STATUSES, CandidateRecord, TuneRecord
from kvlab.store.tables import TrialRow, TuneCandidateRow, TuneRow
from kvlab.store.transitions import add_event, roll_up

if TYPE_CHECKING:
    from kvlab.core.kv_config import KVCacheConfig

#: What a driver's verdict on a candidate may set (:meth:`TuneQueries.judge_candidate`): the candidate row's
#: columns but its keys and the time of the verdict, which the store sets.
_VERDICT_FIELDS = frozenset(TuneCandidateRow.__table__.columns.keys()) - {"trial_id", "experiment_id", "judged_at"}

#: A driver silent for this long is gone: another ``kvlab tune --resume`` may take over.
DRIVER_STALE_S = 60.0


class TuneBusyError(StoreError):
    """Another live driver runs this tune."""


def driver_is_dead(driver_id: str) -> bool:
    """True when ``driver_id`` (a driver's or worker's ``host-pid-xxxxxx``) names a process of this
    host that no longer exists."""
    host, _, rest = driver_id.rpartition("-")[0].rpartition("-")
    pid = rest
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def study_name(experiment_id: int) -> str:
    """The Optuna study of the tune of ``experiment_id``, in the study storage beside the store."""
    return f"kvlab-experiment-{experiment_id}"


def optuna_schema(url: URL) -> str:
    """The PostgreSQL schema of a store's studies: its own first search_path schema + ``_optuna``."""
    options = str(url.query.get("options", ""))
    for part in options.split():
        if part.startswith("-csearch_path="):
            return part.split("=", 1)[1].split(",")[0].strip().strip('"') + "_optuna"
    return "kvlab_optuna"


def study_storage_url(engine: Engine) -> str:
    """The study storage URL beside the store of ``engine`` (password included: never shown or stored)."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if not database or database == ":memory:" or url.query.get("mode") == "memory":
            raise ValueError("kvlab tune needs a store on disk (a SQLite file or PostgreSQL), not an in-memory one")
        path = Path(database.removeprefix("file:"))
        return URL.create("sqlite", database=str(path.with_name(f"{path.stem}.optuna{path.suffix or '.sqlite'}"))
                          ).render_as_string(hide_password=False)
    schema = optuna_schema(url)
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    # the store's other connection options (a statement timeout, an application name) hold for Optuna too:
    # only its search path is replaced
    kept = [part for part in str(url.query.get("options", "")).split() if not part.startswith("-csearch_path=")]
    return url.update_query_dict({"options": " ".join([*kept, f"-csearch_path={schema}"])}
                                 ).render_as_string(hide_password=False)


class TuneQueries:
    """Tune reads and writes (see the module docstring); relies on the Store's session helpers."""

    _session: Any
    _lock_experiment: Any
    engine: Engine

    def study_storage_url(self) -> str:
        """Where this store's Optuna studies live, password included (for Optuna only: never shown or stored)."""
        return study_storage_url(self.engine)

    def start_tune(self, experiment_id: int, grid_points: int, grid_item_evals: int, driver_id: str | None) -> None:
        """Record the search on a new experiment, with ``driver_id`` as its driver (None: the driver that
        takes it over later, :meth:`take_over_tune`)."""
        now = datetime.now(UTC)
        with self._session(write=True) as session:
            self._lock_experiment(session, experiment_id)
            existing = session.get(TuneRow, experiment_id)
            if existing is not None:
                raise StoreError(f"experiment {experiment_id} already has a tune ({existing.state}): "
                                 f"`kvlab tune --resume {experiment_id}` drives it")
            session.add(TuneRow(experiment_id=experiment_id, study_name=study_name(experiment_id), state="running",
                                driver_id=driver_id, driver_seen_at=now, grid_points=grid_points,
                                grid_item_evals=grid_item_evals, started_at=now))

    def take_over_tune(self, experiment_id: int, driver_id: str, stale_after_s: float = DRIVER_STALE_S) -> str | None:
        """Become the driver of a running tune (``kvlab tune --resume``); returns the driver replaced.

        Raises :class:`TuneBusyError` while its driver is alive: heartbeating within
        ``stale_after_s``, unless it is a process of this host that no longer exists (SIGKILLed).
        """
        now = datetime.now(UTC)
        with self._session(write=True) as session:
            self._lock_experiment(session, experiment_id)
            row = session.get(TuneRow, experiment_id)
            if row is None:
                raise StoreError(f"experiment {experiment_id} is a sweep, not a tune: there is no search to resume "
                                 f"(`kvlab rerun {experiment_id}` runs it again)")
            if row.state != "running":
                raise StoreError(f"the tune of experiment {experiment_id} is {row.state}; nothing to resume")
            previous = row.driver_id
            fresh = row.driver_seen_at is not None and now - row.driver_seen_at < timedelta(seconds=stale_after_s)
            if previous and previous != driver_id and fresh and not driver_is_dead(previous):
                raise TuneBusyError(f"experiment {experiment_id}: its tune is driven by {previous} (seen "
                                    f"{(now - row.driver_seen_at).total_seconds():.0f} s ago); add workers with "
                                    "`kvlab worker` instead, or resume once it has stopped")
            row.driver_id, row.driver_seen_at = driver_id, now
            return previous

    def requeue_orphans(self, experiment_id: int) -> list[int]:
        """Requeue the experiment's running trials held by workers of this host whose process is gone
        (a SIGKILLed ``kvlab tune`` took its in-process worker with it): at once, not after the stale timeout."""
        with self._session(write=True) as session:
            rows = session.execute(select(TrialRow.id, TrialRow.worker_id, TrialRow.config_name).where(
                TrialRow.experiment_id == experiment_id, TrialRow.status == "running")).all()
            orphans = [row for row in rows if row.worker_id and driver_is_dead(row.worker_id)]
            for row in orphans:
                session.execute(update(TrialRow).where(TrialRow.id == row.id, TrialRow.status == "running")
                                .values(status="queued", worker_id=None, claimed_at=None, heartbeat_at=None))
                add_event(session, experiment_id, f"trial {row.id} ({row.config_name}): its worker {row.worker_id} is "
                          "gone from this host; requeued", level="warning", trial_id=row.id)
            return [row.id for row in orphans]

    def tune_heartbeat(self, experiment_id: int, driver_id: str) -> bool:
        """Mark the driver alive; False when it is no longer this tune's driver (or the tune ended)."""
        with self._session(write=True) as session:
            return bool(session.scalars(
                update(TuneRow).where(TuneRow.experiment_id == experiment_id, TuneRow.driver_id == driver_id,
                                      TuneRow.state == "running")
                .values(driver_seen_at=datetime.now(UTC)).returning(TuneRow.experiment_id)).all())

    def add_candidates(self, experiment_id: int, candidates: Sequence[tuple[KVCacheConfig, int | None]],
                       item_limit: int) -> list[int]:
        """Queue one trial per (config, Optuna trial number) on its first ``item_limit`` items; returns their ids."""
        if not candidates:
            return []
        with self._session(write=True) as session:
            experiment = self._lock_experiment(session, experiment_id)
            if experiment.status in TERMINAL_STATUSES:
                raise StoreError(f"experiment {experiment_id} is {experiment.status}: no new trials")
            position = session.scalar(select(func.max(TrialRow.position))
                                      .where(TrialRow.experiment_id == experiment_id))
            position = -1 if position is None else position
            ids = list(session.scalars(insert(TrialRow).returning(TrialRow.id, sort_by_parameter_order=True), [
                {"experiment_id": experiment_id, "position": position + 1 + i, "config_name": config.label,
                 "config": config.model_dump(mode="json"), "status": "queued", "attempts": 0, "items_done": 0,
                 "item_limit": item_limit}
                for i, (config, _) in enumerate(candidates)]))
            session.execute(insert(TuneCandidateRow), [
                {"trial_id": trial_id, "experiment_id": experiment_id, "number": number, "rung": 0,
                 "state": "active", "judged_items": 0}
                for trial_id, (_, number) in zip(ids, candidates, strict=True)])
            if experiment.status == "queued":
                experiment.status = "running"
            add_event(session, experiment_id, f"round: {len(ids)} candidate(s) on {item_limit} items: "
                      + ", ".join(c.label for c, _ in candidates))
            return ids

    def track_trial(self, experiment_id: int, trial_id: int, number: int | None = None) -> None:
        """Give an existing trial (the baseline) a candidate row, so its progress shows with the others."""
        with self._session(write=True) as session:
            trial = session.get(TrialRow, trial_id)
            if trial is None or trial.experiment_id != experiment_id:
                raise StoreError(f"experiment {experiment_id} has no trial {trial_id}")
            if session.get(TuneCandidateRow, trial_id) is None:
                session.add(TuneCandidateRow(trial_id=trial_id, experiment_id=experiment_id, number=number, rung=0,
                                             state="active", judged_items=0))

    def extend_trials(self, trial_ids: Sequence[int], item_limit: int, rung: int | None = None) -> list[int]:
        """Raise the trials' item limit to ``item_limit`` (a promotion); those that had ended go back
        to the queue, keeping their results.  Returns the ids requeued."""
        if not trial_ids:
            return []
        with self._session(write=True) as session:
            tunes = session.execute(select(TrialRow.id, TuneRow.experiment_id, TuneRow.state)
                                    .join(TuneRow, TuneRow.experiment_id == TrialRow.experiment_id, isouter=True)
                                    .where(TrialRow.id.in_(list(trial_ids)))).all()
            missing = sorted(set(trial_ids) - {trial_id for trial_id, _, _ in tunes})
            if missing:
                raise StoreError(f"no trial {', '.join(map(str, missing))}: nothing was promoted")
            for trial_id, experiment_id, state in tunes:
                if state != "running":  # a worker would run trials of a search that has ended, or of a sweep
                    raise StoreError(f"trial {trial_id} is not in a running tune "
                                     f"({'no tune' if experiment_id is None else f'its tune is {state}'}): "
                                     "nothing was promoted")
            session.execute(update(TrialRow).where(TrialRow.id.in_(list(trial_ids)))
                            .values(item_limit=item_limit).execution_options(synchronize_session=False))
            requeued = list(session.scalars(
                update(TrialRow).where(TrialRow.id.in_(list(trial_ids)), TrialRow.status == "done")
                .values(status="queued", worker_id=None, claimed_at=None, heartbeat_at=None, finished_at=None)
                .returning(TrialRow.id).execution_options(synchronize_session=False)))
            if rung is not None:
                session.execute(update(TuneCandidateRow).where(TuneCandidateRow.trial_id.in_(list(trial_ids)))
                                .values(rung=rung).execution_options(synchronize_session=False))
            return requeued

    def judge_candidate(self, trial_id: int, **verdict: Any) -> None:
        """Record the driver's latest verdict on a trial (fields of :class:`CandidateRecord`)."""
        unknown = sorted(set(verdict) - _VERDICT_FIELDS)
        if unknown:
            raise StoreError(f"a candidate's verdict has no field {', '.join(unknown)} "
                             f"(it has {', '.join(sorted(_VERDICT_FIELDS))})")
        if "state" in verdict and verdict["state"] not in CANDIDATE_STATES:
            raise StoreError(f"candidate state {verdict['state']!r}: one of {', '.join(CANDIDATE_STATES)}")
        with self._session(write=True) as session:
            session.execute(update(TuneCandidateRow).where(TuneCandidateRow.trial_id == trial_id)
                            .values(**verdict, judged_at=time.time()))

    def finish_tune(self, experiment_id: int, state: str, recommendation: dict[str, Any] | None,
                    note: str | None) -> None:
        """End the search; the experiment ends with it once its trials have.  A tune that ends cancelled or
        failed takes its queued and running trials with it (no worker runs a trial of a search that has
        ended) and ends the experiment so, even when every trial had finished.  A tune that has already ended
        keeps its ending: the store's cancel (the page's Cancel, ``kvlab cancel``) ends it first, and its
        driver's own "cancelled" when it notices must not overwrite when and why it ended."""
        now = datetime.now(UTC)
        with self._session(write=True) as session:
            experiment = self._lock_experiment(session, experiment_id)
            row = session.get(TuneRow, experiment_id)
            if row is None:
                raise ExperimentNotFoundError(f"experiment {experiment_id} has no tune")
            if row.state != "running":
                return
            row.state, row.recommendation, row.note, row.finished_at = state, recommendation, note, now
            if state != "done":
                session.execute(update(TrialRow).where(TrialRow.experiment_id == experiment_id,
                                                       TrialRow.status.in_(("queued", "running")))
                                .values(status="cancelled", finished_at=now))
            add_event(session, experiment_id, f"tune {state}" + (f": {note}" if note else ""),
                      level="error" if state == "failed" else "info")
            session.flush()
            if state == "done":
                roll_up(session, experiment, now)
            # ended otherwise: so ends the experiment, even one whose trials had all finished, unless it had
            # already failed or been cancelled
            elif experiment.status not in ("failed", "cancelled"):
                experiment.status, experiment.finished_at = ("cancelled" if state == "cancelled" else "failed"), now
                experiment.error = note if state == "failed" else None

    def tune(self, experiment_id: int) -> TuneRecord | None:
        """The experiment's tune, or None for a plain experiment."""
        with self._session() as session:
            row = session.get(TuneRow, experiment_id)
            return None if row is None else TuneRecord(
                **{c.key: getattr(row, c.key) for c in TuneRow.__table__.columns})

    def candidates(self, experiment_id: int) -> list[CandidateRecord]:
        """The tune's verdicts, in trial order."""
        with self._session() as session:
            rows = session.scalars(select(TuneCandidateRow).where(TuneCandidateRow.experiment_id == experiment_id)
                                   .order_by(TuneCandidateRow.trial_id)).all()
            return [CandidateRecord(**{c.key: getattr(r, c.key) for c in TuneCandidateRow.__table__.columns})
                    for r in rows]
