"""The experiment store: every read and write of experiments, trials, results, telemetry and events.

Every method runs in its own short transaction and returns plain records (``kvlab.store.records``),
never ORM objects, so callers can keep them across threads and processes.

Concurrency (several worker processes, possibly on several hosts):

* SQLite: every write transaction starts with ``BEGIN IMMEDIATE`` (one writer at a time, waiting up
  to the busy timeout), so read-then-write sequences such as a claim are atomic.
* PostgreSQL: claims lock queued trial rows with ``FOR UPDATE SKIP LOCKED``, so concurrent workers
  take disjoint trials without waiting.  Changes that look at all trials of an experiment (finishing
  the last trial rolls the experiment up; cancel; stale recovery) first lock the experiment row
  (``FOR NO KEY UPDATE``, which inserts referencing it do not wait for), so two workers finishing
  the last two trials at once cannot both miss the roll-up.  Lock order is always experiment, then
  its trials; a claim locks only trials and marks the experiment running in a second transaction.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine, Select, case, cast, delete, exists, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kvlab.core.results import ItemResult
from kvlab.secrets import redact
from kvlab.store import migrate
from kvlab.store.database import WRITE, create_store_engine, resolve_url, shown_url, sqlite_file, translate_errors
from kvlab.store.errors import (
    ExperimentNotFoundError,
    StoreError,
    StoreLost,
    StoreReadOnlyError,
    TrialNotFoundError,
)
from kvlab.store.records import (
    PHASES,
    SOURCES,
    STATUSES,
    TERMINAL_STATUSES,
    EventRecord,
    ExperimentRecord,
    LoadLevelRecord,
    TelemetrySample,
    TrialRecord,
)
from kvlab.store.tables import EventRow, ExperimentRow, ItemResultRow, LoadLevelRow, TelemetryRow, TrialRow, TuneRow
from kvlab.store.transitions import ACTIVE, ENDED_WITHOUT_RESULTS, add_event, roll_up
from kvlab.store.tunes import TuneQueries

if TYPE_CHECKING:  # the spec's pydantic models are imported where a spec is written, not by every read
    from kvlab.core.experiment_spec import ExperimentSpec
    from kvlab.store.protocol import ExperimentStore

ORDER_FIELDS = ("id", "name", "status", "created_at", "started_at", "finished_at")
_RESULT_FIELDS = [f.name for f in fields(ItemResult)]
#: ItemResult floats that are never None: SQLite stores NaN as NULL, so NULL reads back as NaN.
_NAN_FIELDS = ("kept_tokens", "kept_fraction", "compression_ratio", "ttft_s", "prefill_s", "compress_s",
               "decode_s")
_TELEMETRY_FIELDS = [f.name for f in fields(TelemetrySample)]


def _now() -> datetime:
    return datetime.now(UTC)


class Store(TuneQueries):
    """The experiment store on a SQLite file or a PostgreSQL database.

    ``url``: any SQLAlchemy URL of SQLite or PostgreSQL (default ``$KVLAB_DATABASE_URL``, else
    ``<repo>/db/kvlab.sqlite``).  ``create``: give an *empty* database the schema (a database at an
    older revision is never migrated implicitly).  ``check``: raise :class:`SchemaOutdatedError`
    unless the schema is current; ``kvlab db upgrade`` opens the store with ``check=False`` and
    calls :meth:`upgrade`.

    A SQLite file is watched for being lost under this process (:meth:`check_intact`): deleted,
    replaced or made read-only, SQLite would go on writing to the old inode, or fail, silently.
    """

    def __init__(self, url: str | None = None, create: bool = True, check: bool = True) -> None:
        self._url = resolve_url(url)
        self.url = shown_url(url)
        self.engine: Engine = create_store_engine(self._url)
        self.dialect = self.engine.dialect.name
        try:
            with self._errors():
                if create and self._is_empty():
                    migrate.upgrade(self.engine, only_if_empty=True)
                if check:
                    self.check_schema()
        except BaseException:
            self.engine.dispose()
            raise
        self._file = _FileIdentity.of(self._url)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    # -- schema -------------------------------------------------------------------------------

    def _is_empty(self) -> bool:
        with self.engine.connect() as connection:
            return migrate.stamped_revision(connection) is None and not migrate.has_tables(connection)

    def schema_revision(self) -> str | None:
        """The database's schema revision (None: no kvlab schema); compare ``migrate.head_revision()``."""
        with self._errors(), self.engine.connect() as connection:
            return migrate.current_revision(connection)

    def check_schema(self) -> None:
        """Raise :class:`SchemaOutdatedError` unless the schema is at this kvlab's revision."""
        with self._errors(), self.engine.connect() as connection:
            migrate.check(connection)

    def upgrade(self, revision: str = "head") -> tuple[str | None, str | None]:
        """``alembic upgrade`` (head by default); returns the revisions before and after."""
        with self._errors():
            return migrate.upgrade(self.engine, revision)

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` ("ok" when sound); "ok" on PostgreSQL."""
        if self.dialect != "sqlite":
            return "ok"
        with self._errors(), self.engine.connect() as connection:
            return "\n".join(row[0] for row in connection.exec_driver_sql("PRAGMA integrity_check"))

    # -- plumbing -----------------------------------------------------------------------------

    def _errors(self) -> AbstractContextManager[None]:
        return translate_errors(self._url, self.url)

    def check_intact(self) -> None:
        """Raise :class:`StoreLost` if the SQLite file this store opened was deleted or replaced, or
        was writable when opened and no longer is.  A stat and an access check: cheap enough for
        every heartbeat.  Nothing to check on PostgreSQL (the pool reconnects to a restarted server)
        or in memory."""
        if self._file is not None:
            self._file.check(self.url)

    @contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        """One transaction; ``write`` takes SQLite's write lock up front (``BEGIN IMMEDIATE``).  A write
        refused as read-only in a store that was writable when opened is :class:`StoreLost`."""
        try:
            with self._errors(), Session(self.engine, expire_on_commit=False) as session, session.begin():
                if write:
                    session.connection(execution_options={WRITE: True})
                yield session
        except StoreReadOnlyError as error:
            if write and self._file is not None and self._file.writable:
                raise StoreLost(f"the store {self.url} became read-only while this process used it ({error}): "
                                "nothing it writes is kept any more") from error
            raise

    @staticmethod
    @contextmanager
    def _missing(what: str) -> Iterator[None]:
        """A foreign key violation here means the experiment or trial does not exist (any more)."""
        try:
            yield
        except IntegrityError:
            raise ExperimentNotFoundError(f"cannot store {what}: no such experiment or trial (deleted?)") from None

    def _locking(self, stmt: Select[Any], skip_locked: bool = False) -> Select[Any]:
        """``FOR NO KEY UPDATE`` on PostgreSQL: kvlab never changes keys, so inserts that reference the
        row go on.  SQLite has no row locks: there ``BEGIN IMMEDIATE`` serialises the writers."""
        if self.dialect != "postgresql":
            return stmt
        return stmt.with_for_update(key_share=True, skip_locked=skip_locked)

    def _lock_experiment(self, session: Session, experiment_id: int) -> ExperimentRow:
        row = session.scalar(self._locking(select(ExperimentRow).where(ExperimentRow.id == experiment_id)))
        if row is None:
            raise ExperimentNotFoundError(f"no experiment {experiment_id}; `kvlab ls` lists them")
        return row

    def _insert(self) -> Any:
        return postgresql.insert if self.dialect == "postgresql" else sqlite.insert

    # -- experiments --------------------------------------------------------------------------

    def create_experiment(self, spec: ExperimentSpec, environment: dict[str, Any], status: str = "queued",
                          item_limit: int | None = None) -> int:
        """Store the experiment with one queued trial per config (baseline at position 0), each on
        its first ``item_limit`` items when given (a tune's first round).

        ``environment`` is :func:`kvlab.experiments.provenance.environment` (versions, git commit, hardware) of
        the host that queues it; a worker on another host records its own with
        :meth:`record_environment`.  ``status="running"`` is for a foreground run, which then
        claims the trials itself with ``claim_trials(..., experiment_id=...)``.
        """
        from kvlab.core.experiment_spec import spec_to_dict

        if status not in ACTIVE:
            raise ValueError(f"a new experiment is queued or running, not {status!r}")
        now = _now()
        configs = spec.all_configs()
        with self._session(write=True) as session:
            row = ExperimentRow(
                name=spec.name, tags=list(spec.tags), notes=redact(spec.notes), spec=spec_to_dict(spec),
                seed=spec.seed, model=spec.model, backend_kind=spec.backend.kind, status=status,
                created_at=now, started_at=now if status == "running" else None, **_environment_columns(environment),
            )
            session.add(row)
            session.flush()
            session.execute(insert(TrialRow), [
                {"experiment_id": row.id, "position": position, "config_name": config.label,
                 "config": config.model_dump(mode="json"), "status": "queued", "attempts": 0, "items_done": 0,
                 "item_limit": item_limit}
                for position, config in enumerate(configs)
            ])
            add_event(session, row.id, f"created with {len(configs)} configs: {', '.join(c.label for c in configs)}")
            return row.id

    def record_environment(self, experiment_id: int, environment: dict[str, Any]) -> None:
        """Replace the experiment's versions, git commit and hardware (the host that runs it)."""
        with self._session(write=True) as session:
            if not session.scalars(update(ExperimentRow).where(ExperimentRow.id == experiment_id)
                                   .values(**_environment_columns(environment)).returning(ExperimentRow.id)).all():
                raise ExperimentNotFoundError(f"no experiment {experiment_id}; `kvlab ls` lists them")

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        with self._session() as session:
            row = session.get(ExperimentRow, experiment_id)
            if row is None:
                raise ExperimentNotFoundError(f"no experiment {experiment_id}; `kvlab ls` lists them")
            return _experiment_record(row, _trial_counts(session, [experiment_id]).get(experiment_id, {}))

    def list_experiments(self, status: str | None = None, search: str | None = None, tag: str | None = None,
                         limit: int = 100, offset: int = 0, order: str = "-created_at") -> list[ExperimentRecord]:
        """A page of experiments with their trial counts (two queries whatever the page size).

        ``search``: case-insensitive substring of the name, notes or model; ``tag``: exact tag;
        ``order``: a field of ``ORDER_FIELDS``, ``-`` first for descending (NULLs last either way).
        """
        if status is not None and status not in STATUSES:
            raise ValueError(f"status {status!r}: one of {', '.join(STATUSES)}")
        field = order.removeprefix("-")
        if field not in ORDER_FIELDS:
            raise ValueError(f"order {order!r}: one of {', '.join(ORDER_FIELDS)}, '-' first for descending")
        column = getattr(ExperimentRow, field)
        direction = column.desc() if order.startswith("-") else column.asc()
        tiebreak = ExperimentRow.id.desc() if order.startswith("-") else ExperimentRow.id.asc()
        stmt = select(ExperimentRow).order_by(direction.nulls_last(), tiebreak).limit(limit).offset(offset)
        if status is not None:
            stmt = stmt.where(ExperimentRow.status == status)
        if search:
            stmt = stmt.where(ExperimentRow.name.icontains(search, autoescape=True)
                              | ExperimentRow.notes.icontains(search, autoescape=True)
                              | ExperimentRow.model.icontains(search, autoescape=True))
        if tag is not None:
            stmt = stmt.where(self._has_tag(tag))
        with self._session() as session:
            rows = session.scalars(stmt).all()
            counts = _trial_counts(session, [row.id for row in rows])
            return [_experiment_record(row, counts.get(row.id, {})) for row in rows]

    def set_notes(self, experiment_id: int, notes: str) -> str:
        """Replace the experiment's notes (free text, as a spec's ``notes``: at most ``MAX_NOTES_CHARS``
        printable characters, newlines and tabs); returns them as stored.  Like every text the store
        keeps, they pass through :func:`~kvlab.secrets.redact` first: a URL's password or a known key
        pasted into a note is masked before it is written, so no page, export or report can show it."""
        from kvlab.core.limits import MAX_NOTES_CHARS, check_text

        try:
            stored = redact(check_text(notes, MAX_NOTES_CHARS, allowed="\n\t"))
        except ValueError as error:
            raise StoreError(f"notes of experiment {experiment_id}: {error}") from None
        with self._session(write=True) as session:
            if not session.scalars(update(ExperimentRow).where(ExperimentRow.id == experiment_id)
                                   .values(notes=stored).returning(ExperimentRow.id)).all():
                raise ExperimentNotFoundError(f"no experiment {experiment_id}; `kvlab ls` lists them")
        return stored

    def _has_tag(self, tag: str) -> Any:
        if self.dialect == "postgresql":
            return cast(ExperimentRow.tags, JSONB).contains([tag])
        values = func.json_each(ExperimentRow.tags).table_valued("value")
        return exists().where(values.c.value == tag)

    def cancel_experiment(self, experiment_id: int) -> int:
        """Cancel the queued and running trials (their workers learn it from :meth:`heartbeat`);
        returns how many.  Results already stored are kept."""
        now = _now()
        with self._session(write=True) as session:
            row = self._lock_experiment(session, experiment_id)
            if row.status in TERMINAL_STATUSES:
                raise StoreError(f"experiment {experiment_id} is already {row.status}; nothing to cancel")
            cancelled = len(session.scalars(
                update(TrialRow).where(TrialRow.experiment_id == experiment_id, TrialRow.status.in_(ACTIVE))
                .values(status="cancelled", finished_at=now).returning(TrialRow.id)
                .execution_options(synchronize_session=False)).all())
            row.status, row.finished_at = "cancelled", now
            session.execute(update(TuneRow).where(TuneRow.experiment_id == experiment_id, TuneRow.state == "running")
                            .values(state="cancelled", finished_at=now))
            add_event(session, experiment_id, f"cancelled ({cancelled} trials stopped)")
            return cancelled

    def rerun_experiment(self, experiment_id: int, environment: dict[str, Any] | None = None) -> int:
        """A new experiment with the same spec and fresh trials; returns its id.

        ``environment`` defaults to the original's (the worker that runs it records its own).
        """
        from kvlab.core.experiment_spec import parse_spec

        old = self.get_experiment(experiment_id)
        if self.tune(experiment_id) is not None:
            raise StoreError(f"experiment {experiment_id} is a tune: start a new one with `kvlab tune SPEC` "
                             f"(its spec: `kvlab export {experiment_id}`), or continue it with "
                             f"`kvlab tune --resume {experiment_id}`")
        env = environment if environment is not None else {
            "versions": old.versions, "git_commit": old.git_commit, "hardware": old.hardware}
        new_id = self.create_experiment(parse_spec(old.spec, stored=True), env)
        self.log_event(new_id, f"rerun of experiment {experiment_id}")
        return new_id

    def delete_experiment(self, experiment_id: int) -> None:
        """Delete the experiment with its trials, results, telemetry and events.  A worker still
        running one of its trials learns it from :meth:`heartbeat`."""
        with self._session(write=True) as session:
            if not session.scalars(delete(ExperimentRow).where(ExperimentRow.id == experiment_id)
                                   .returning(ExperimentRow.id)).all():
                raise ExperimentNotFoundError(f"no experiment {experiment_id}; `kvlab ls` lists them")

    # -- trials -------------------------------------------------------------------------------

    def trials(self, experiment_id: int) -> list[TrialRecord]:
        with self._session() as session:
            rows = session.scalars(select(TrialRow).where(TrialRow.experiment_id == experiment_id)
                                   .order_by(TrialRow.position)).all()
            if not rows and session.get(ExperimentRow, experiment_id) is None:
                raise ExperimentNotFoundError(f"no experiment {experiment_id}; `kvlab ls` lists them")
            return [_trial_record(row) for row in rows]

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self._session() as session:
            row = session.get(TrialRow, trial_id)
            if row is None:
                raise TrialNotFoundError(f"no trial {trial_id}")
            return _trial_record(row)

    def claim_trials(self, worker_id: str, max_trials: int = 4, experiment_id: int | None = None,
                     exclude: Collection[int] = ()) -> list[TrialRecord]:
        """Atomically take up to ``max_trials`` queued trials of ONE experiment, lowest position first.

        The experiment is the oldest with queued trials (or ``experiment_id``), skipping those in
        ``exclude`` (experiments the worker could not run lately): several configs of one
        experiment go together because the embedded engine shares each item's prefill across
        them.  Claimed trials are running, owned by ``worker_id``, heartbeat now, attempts + 1.
        Two workers never get the same trial.  Returns [] when nothing is queued.
        """
        if max_trials < 1:
            raise ValueError(f"max_trials must be >= 1, not {max_trials}")
        now = _now()
        with self._session(write=True) as session:
            first = select(TrialRow.experiment_id).where(TrialRow.status == "queued")
            if experiment_id is not None:
                first = first.where(TrialRow.experiment_id == experiment_id)
            if exclude:
                first = first.where(TrialRow.experiment_id.not_in(list(exclude)))
            chosen = session.scalar(self._locking(
                first.order_by(TrialRow.experiment_id, TrialRow.position).limit(1), skip_locked=True))
            if chosen is None:
                return []
            ids = list(session.scalars(self._locking(
                select(TrialRow.id).where(TrialRow.experiment_id == chosen, TrialRow.status == "queued")
                .order_by(TrialRow.position).limit(max_trials), skip_locked=True)))
            if not ids:
                return []
            session.execute(
                update(TrialRow).where(TrialRow.id.in_(ids)).values(
                    status="running", worker_id=worker_id, claimed_at=now, heartbeat_at=now,
                    started_at=func.coalesce(TrialRow.started_at, now), attempts=TrialRow.attempts + 1,
                    finished_at=None, error=None,
                ).execution_options(synchronize_session=False))
            rows = session.scalars(select(TrialRow).where(TrialRow.id.in_(ids)).order_by(TrialRow.position)
                                   .execution_options(populate_existing=True)).all()
            for row in rows:
                add_event(session, chosen, f"trial {row.id} ({row.config_name}) claimed by worker {worker_id} "
                          f"(attempt {row.attempts})", trial_id=row.id)
            claimed = [_trial_record(row) for row in rows]
        # A second transaction: under the lock order (experiment, then trials) a claim holding trial
        # locks must not wait for the experiment row.
        # A tune's experiment is running (its first round queued) before any claim: it starts here too.
        with self._session(write=True) as session:
            not_started = (ExperimentRow.status == "queued") | ((ExperimentRow.status == "running")
                                                                & ExperimentRow.started_at.is_(None))
            session.execute(update(ExperimentRow).where(ExperimentRow.id == chosen, not_started)
                            .values(status="running", started_at=func.coalesce(ExperimentRow.started_at, now)))
        return claimed

    def heartbeat(self, worker_id: str, trial_ids: Iterable[int]) -> set[int]:
        """Mark the worker's trials alive; returns those it no longer owns (cancelled, requeued,
        failed by stale recovery, claimed by another worker, deleted): the worker stops them."""
        wanted = set(trial_ids)
        if not wanted:
            return set()
        with self._session(write=True) as session:
            alive = set(session.scalars(
                update(TrialRow)
                .where(TrialRow.id.in_(wanted), TrialRow.worker_id == worker_id, TrialRow.status == "running")
                .values(heartbeat_at=_now()).returning(TrialRow.id)
                .execution_options(synchronize_session=False)))
        return wanted - alive

    def release_trials(self, worker_id: str, trial_ids: Iterable[int], reason: str) -> list[int]:
        """Give trials back to the queue because their worker cannot run them (a problem of its
        host, not of the spec): of ``trial_ids``, those still running and owned by ``worker_id``
        become queued for any worker, keeping their item results (the next worker skips those
        items).  One warning event per experiment names the worker and ``reason``.  Trials that
        ended, were cancelled or were taken away meanwhile are left alone.  Returns the released ids.
        """
        wanted = set(trial_ids)
        if not wanted:
            return []
        with self._session(write=True) as session:
            released = session.execute(
                update(TrialRow)
                .where(TrialRow.id.in_(wanted), TrialRow.worker_id == worker_id, TrialRow.status == "running")
                .values(status="queued", worker_id=None, claimed_at=None, heartbeat_at=None)
                .returning(TrialRow.id, TrialRow.experiment_id, TrialRow.config_name, TrialRow.items_done)
                .execution_options(synchronize_session=False)).all()
            for experiment_id in sorted({row.experiment_id for row in released}):
                rows = sorted((row for row in released if row.experiment_id == experiment_id), key=lambda r: r.id)
                add_event(session, experiment_id,
                          f"worker {worker_id} could not run trial(s) {', '.join(r.config_name for r in rows)}: "
                          f"{reason}; "
                          f"back in the queue for another worker ({sum(r.items_done for r in rows)} item results kept)",
                          level="warning", trial_id=rows[0].id if len(rows) == 1 else None)
            return sorted(row.id for row in released)

    def set_items_total(self, trial_id: int, n: int) -> None:
        with self._session(write=True) as session:
            if not session.scalars(update(TrialRow).where(TrialRow.id == trial_id).values(items_total=n)
                                   .returning(TrialRow.id)).all():
                raise TrialNotFoundError(f"no trial {trial_id}")

    def finish_trial(self, trial_id: int, status: str, error: str | None = None, worker_id: str | None = None) -> bool:
        """End a trial as ``done``, ``failed`` or ``cancelled``; when it was the experiment's last
        active trial, the experiment becomes done (all done), failed (any failed) or cancelled.

        Returns False, changing nothing, when the trial has already ended (e.g. it was cancelled
        meanwhile) or, with ``worker_id``, when that worker no longer owns it.
        """
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"a trial finishes as one of {', '.join(TERMINAL_STATUSES)}, not {status!r}")
        error = redact(error) if error else error  # no secret is stored (kvlab.secrets)
        now = _now()
        with self._session(write=True) as session:
            experiment_id = session.scalar(select(TrialRow.experiment_id).where(TrialRow.id == trial_id))
            if experiment_id is None:
                raise TrialNotFoundError(f"no trial {trial_id}")
            experiment = self._lock_experiment(session, experiment_id)
            trial = session.scalars(self._locking(select(TrialRow).where(TrialRow.id == trial_id))
                                    .execution_options(populate_existing=True)).one()
            if trial.status in TERMINAL_STATUSES or (worker_id is not None and trial.worker_id != worker_id):
                return False
            trial.status, trial.error, trial.finished_at = status, error, now
            progress = f"{trial.items_done}/{trial.items_total if trial.items_total is not None else '?'} items"
            add_event(session, experiment_id, f"trial {trial_id} ({trial.config_name}) {status} ({progress})"
                      + (f": {error}" if error else ""), level="error" if status == "failed" else "info",
                      trial_id=trial_id)
            session.flush()
            roll_up(session, experiment, now)
            return True

    def requeue_stale(self, stale_after_s: float = 60, on_stale: str = "requeue") -> list[int]:
        """Recover running trials whose worker has not heartbeaten for ``stale_after_s`` seconds.

        ``on_stale="requeue"``: back to queued for any worker (completed item results are kept, and
        :meth:`done_item_keys` lets the next worker skip them); ``"fail"``: failed with the error
        "worker stopped heartbeating".  Logs an event for each; returns their ids.
        """
        if on_stale not in ("requeue", "fail"):
            raise ValueError(f"on_stale must be 'requeue' or 'fail', not {on_stale!r}")
        now = _now()
        cutoff = now - timedelta(seconds=stale_after_s)
        last_seen = func.coalesce(TrialRow.heartbeat_at, TrialRow.claimed_at)
        is_stale = (TrialRow.status == "running") & (last_seen < cutoff)
        recovered: list[int] = []
        with self._session(write=True) as session:
            experiment_ids = sorted(set(session.scalars(select(TrialRow.experiment_id).where(is_stale))))
            for experiment_id in experiment_ids:  # in id order: a consistent lock order
                experiment = self._lock_experiment(session, experiment_id)
                trials = session.scalars(self._locking(
                    select(TrialRow).where(TrialRow.experiment_id == experiment_id, is_stale)
                    .order_by(TrialRow.position)).execution_options(populate_existing=True)).all()
                for trial in trials:
                    seen = trial.heartbeat_at or trial.claimed_at or now  # is_stale: one of them is set
                    what = (f"trial {trial.id} ({trial.config_name}): worker {trial.worker_id} stopped heartbeating "
                            f"(last {(now - seen).total_seconds():.0f} s ago)")
                    if on_stale == "requeue":
                        trial.status, trial.worker_id, trial.claimed_at, trial.heartbeat_at = "queued", None, None, None
                        add_event(session, experiment_id, f"{what}; requeued with {trial.items_done} items done",
                                  level="warning", trial_id=trial.id)
                    else:
                        trial.status, trial.error, trial.finished_at = "failed", "worker stopped heartbeating", now
                        add_event(session, experiment_id, f"{what}; failed", level="error", trial_id=trial.id)
                    recovered.append(trial.id)
                session.flush()
                if on_stale == "fail":
                    roll_up(session, experiment, now)
        return recovered

    # -- results ------------------------------------------------------------------------------

    def add_item_result(self, trial_id: int, result: ItemResult) -> bool:
        """Store one result; False (and nothing changes) if the trial already has this (item, task), or
        if it was cancelled or failed meanwhile: no evaluation counts after a cancel (the worker that gets
        False for that reason stops the trial at once, not at its next heartbeat)."""
        with self._session(write=True) as session:
            trial = session.scalar(self._locking(select(TrialRow).where(TrialRow.id == trial_id)))
            if trial is None:
                raise TrialNotFoundError(f"no trial {trial_id}")
            experiment_id = trial.experiment_id
            if trial.status in ENDED_WITHOUT_RESULTS:
                return False
            inserted = session.scalar(
                self._insert()(ItemResultRow)
                .values(trial_id=trial_id, experiment_id=experiment_id,
                        **asdict(result) | {"error": result.error and redact(result.error)})
                .on_conflict_do_nothing(index_elements=["trial_id", "item_id", "task"])
                .returning(ItemResultRow.id))
            if inserted is None:
                return False
            session.execute(update(TrialRow).where(TrialRow.id == trial_id)
                            .values(items_done=TrialRow.items_done + 1))
            return True

    def done_item_keys(self, trial_id: int) -> set[tuple[str, str]]:
        """``(item_id, task)`` of the results the trial already has (a resumed trial skips them)."""
        with self._session() as session:
            return {(item_id, task) for item_id, task in session.execute(
                select(ItemResultRow.item_id, ItemResultRow.task).where(ItemResultRow.trial_id == trial_id))}

    def item_results(self, experiment_id: int, trial_id: int | None = None) -> list[ItemResult]:
        """The experiment's results (or one trial's), in trial position then insertion order."""
        stmt = (select(*(getattr(ItemResultRow, name) for name in _RESULT_FIELDS))
                .join(TrialRow, TrialRow.id == ItemResultRow.trial_id)
                .where(ItemResultRow.experiment_id == experiment_id)
                .order_by(TrialRow.position, ItemResultRow.id))
        if trial_id is not None:
            stmt = stmt.where(ItemResultRow.trial_id == trial_id)
        with self._session() as session:
            return [_item_result(row._mapping) for row in session.execute(stmt)]

    def add_load_level(self, trial_id: int, mode: str, level: float, result: dict[str, Any]) -> bool:
        """Store one load level of a trial's server; False (nothing changes) if the trial has it already, or was
        cancelled or failed meanwhile (as :meth:`add_item_result`).  Its first error is redacted."""
        with self._session(write=True) as session:
            trial = session.scalar(self._locking(select(TrialRow).where(TrialRow.id == trial_id)))
            if trial is None:
                raise TrialNotFoundError(f"no trial {trial_id}")
            if trial.status in ENDED_WITHOUT_RESULTS:
                return False
            result = result | {"first_error": result.get("first_error") and redact(result["first_error"])}
            inserted = session.scalar(
                self._insert()(LoadLevelRow)
                .values(trial_id=trial_id, experiment_id=trial.experiment_id, config_name=trial.config_name,
                        mode=mode, level=level, result=result)
                .on_conflict_do_nothing(index_elements=["trial_id", "mode", "level"])
                .returning(LoadLevelRow.id))
            return inserted is not None

    def load_levels(self, experiment_id: int, trial_id: int | None = None) -> list[LoadLevelRecord]:
        """The experiment's load levels (or one trial's), in trial position, then mode and level."""
        stmt = (select(LoadLevelRow.trial_id, LoadLevelRow.config_name, LoadLevelRow.mode, LoadLevelRow.level,
                       LoadLevelRow.result)
                .join(TrialRow, TrialRow.id == LoadLevelRow.trial_id)
                .where(LoadLevelRow.experiment_id == experiment_id)
                .order_by(TrialRow.position, LoadLevelRow.mode, LoadLevelRow.level))
        if trial_id is not None:
            stmt = stmt.where(LoadLevelRow.trial_id == trial_id)
        with self._session() as session:
            return [LoadLevelRecord(**row._mapping) for row in session.execute(stmt)]

    # -- telemetry and events -----------------------------------------------------------------

    def add_telemetry(self, rows: Sequence[TelemetrySample]) -> None:
        """Insert a batch of samples in one statement (executemany)."""
        if not rows:
            return
        for row in rows:
            if row.phase not in PHASES:
                raise ValueError(f"telemetry phase {row.phase!r}: one of {', '.join(PHASES)}")
            if row.source not in SOURCES:
                raise ValueError(f"telemetry source {row.source!r}: one of {', '.join(SOURCES)}")
        experiments = sorted({row.experiment_id for row in rows})
        with self._missing(f"telemetry for experiment(s) {experiments}"), self._session(write=True) as session:
            # render_nulls: by default the ORM leaves None values out of a bulk insert, which splits
            # the batch into one statement wherever the set of missing readings changes.
            session.execute(insert(TelemetryRow).execution_options(render_nulls=True),
                            [asdict(row) for row in rows])

    def telemetry(self, experiment_id: int, trial_id: int | None = None, since_ts: float | None = None,
                  limit: int | None = None) -> list[TelemetrySample]:
        """Samples in time order; ``since_ts``: only later ones (for polling); ``limit``: the latest N."""
        stmt = select(*(getattr(TelemetryRow, name) for name in _TELEMETRY_FIELDS)).where(
            TelemetryRow.experiment_id == experiment_id)
        if trial_id is not None:
            stmt = stmt.where(TelemetryRow.trial_id == trial_id)
        if since_ts is not None:
            stmt = stmt.where(TelemetryRow.ts > since_ts)
        if limit is not None:
            stmt = stmt.order_by(TelemetryRow.ts.desc(), TelemetryRow.id.desc()).limit(limit)
        else:
            stmt = stmt.order_by(TelemetryRow.ts, TelemetryRow.id)
        with self._session() as session:
            samples = [TelemetrySample(**row._mapping) for row in session.execute(stmt)]
        return samples[::-1] if limit is not None else samples

    def log_event(self, experiment_id: int, message: str, level: str = "info", trial_id: int | None = None) -> None:
        with self._missing(f"an event for experiment {experiment_id}"), self._session(write=True) as session:
            add_event(session, experiment_id, message, level=level, trial_id=trial_id)

    def events(self, experiment_id: int) -> list[EventRecord]:
        with self._session() as session:
            rows = session.scalars(select(EventRow).where(EventRow.experiment_id == experiment_id)
                                   .order_by(EventRow.ts, EventRow.id)).all()
            return [EventRecord(id=r.id, experiment_id=r.experiment_id, trial_id=r.trial_id, ts=r.ts,
                                level=r.level, message=r.message) for r in rows]


class _FileIdentity:
    """A SQLite file as it was when the store opened it: which inode, and whether it could be written."""

    def __init__(self, path: Path, stat: os.stat_result, writable: bool) -> None:
        self.path, self.inode, self.writable = path, (stat.st_dev, stat.st_ino), writable

    @classmethod
    def of(cls, url: URL) -> _FileIdentity | None:
        path = sqlite_file(url)
        if path is None:
            return None
        path = path.resolve()
        try:
            stat = path.stat()
        except OSError:  # not there (yet): nothing to compare with
            return None
        read_only = url.query.get("mode") == "ro" or url.query.get("immutable") == "1"
        return cls(path, stat, not read_only and os.access(path, os.W_OK))

    def check(self, shown: str) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            stat = None
        if stat is None or (stat.st_dev, stat.st_ino) != self.inode:
            # what happened first, the file's path last: a long path may be cut from a one-line error, not the why
            raise StoreLost(f"the store {shown} is gone: its file was deleted or replaced while this process used it, "
                            f"and nothing it writes there now would be kept ({self.path})")
        if self.writable and not all(os.access(path, os.W_OK) for path in (self.path, self._wal()) if path.exists()):
            raise StoreLost(f"the store {shown} can no longer be written: the permissions of {self.path} (or its "
                            "-wal file) changed while this process used it")

    def _wal(self) -> Path:
        return self.path.with_name(self.path.name + "-wal")


# -- helpers (run inside a session) ---------------------------------------------------------------

def _trial_counts(session: Session, experiment_ids: list[int]) -> dict[int, dict[str, int]]:
    """Trial counts per status and item totals of many experiments in one GROUP BY query."""
    if not experiment_ids:
        return {}
    per_status = [func.sum(case((TrialRow.status == status, 1), else_=0)).label(f"trials_{status}")
                  for status in STATUSES]
    stmt = (select(TrialRow.experiment_id, func.count().label("trials_total"), *per_status,
                   func.coalesce(func.sum(TrialRow.items_total), 0).label("items_total"),
                   func.coalesce(func.sum(TrialRow.items_done), 0).label("items_done"))
            .where(TrialRow.experiment_id.in_(experiment_ids)).group_by(TrialRow.experiment_id))
    return {row.experiment_id: {key: int(value) for key, value in row._mapping.items() if key != "experiment_id"}
            for row in session.execute(stmt)}


def _environment_columns(environment: dict[str, Any]) -> dict[str, Any]:
    return {"versions": environment.get("versions") or {}, "git_commit": environment.get("git_commit"),
            "hardware": environment.get("hardware") or {}}


def _experiment_record(row: ExperimentRow, counts: dict[str, int]) -> ExperimentRecord:
    columns: dict[str, Any] = {c.key: getattr(row, c.key) for c in ExperimentRow.__table__.columns}
    return ExperimentRecord(**columns | counts)


def _trial_record(row: TrialRow) -> TrialRecord:
    return TrialRecord(**{c.key: getattr(row, c.key) for c in TrialRow.__table__.columns})


def _item_result(values: Any) -> ItemResult:
    data = dict(values)
    for name in _NAN_FIELDS:
        if data[name] is None:
            data[name] = math.nan
    return ItemResult(**data)



if TYPE_CHECKING:  # mypy checks that the SQLAlchemy store follows the store's contract
    _CONTRACT: type[ExperimentStore] = Store
