"""The store's contract, by role (as MLflow's abstract store is the contract its SQL and file stores follow).

:class:`kvlab.store.Store` (SQLAlchemy: SQLite or PostgreSQL) is its implementation.  Code that only needs
one role takes that role: a worker's heartbeat a :class:`WorkQueue` and :class:`Integrity`, a telemetry
writer a :class:`TelemetrySink`; code that needs several takes the whole :class:`ExperimentStore`.  Every
method returns plain records (:mod:`kvlab.store.records`), never rows, and raises
:class:`~kvlab.store.errors.StoreError` (or a subclass) for what the user can act on.

Each method's ``Raises`` lists what it raises itself.  Besides, any method may raise ``StoreError`` when the
database fails (unreachable, locked, corrupt), and any write ``StoreReadOnlyError`` when a SQLite database
refuses it as read-only, or ``StoreLost`` when it does so to a store that was writable when opened.  A
``ValueError`` is a bad argument: a bug of the caller.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ExperimentSpec
    from kvlab.core.kv_config import KVCacheConfig
    from kvlab.core.results import ItemResult
    from kvlab.store.records import (
        CandidateRecord,
        EventRecord,
        ExperimentRecord,
        LoadLevelRecord,
        TelemetrySample,
        TrialRecord,
        TuneRecord,
    )


class Experiments(Protocol):
    """Experiments and their trials: created from a spec, listed, annotated (notes), cancelled, rerun, deleted."""

    def create_experiment(self, spec: ExperimentSpec, environment: dict[str, Any], status: str = "queued",
                          item_limit: int | None = None) -> int:
        """Store a new experiment with one queued trial per config of its spec, and log its creation.

        Args:
            spec: The experiment; its ``all_configs()`` become the trials, in that order (position 0: the baseline).
                Its notes are stored redacted (:func:`kvlab.secrets.redact`).
            environment: :func:`kvlab.experiments.provenance.environment` of the host that queues it: its
                ``versions``, ``git_commit`` and ``hardware`` are stored (missing: empty / None).  A worker on
                another host records its own with :meth:`record_environment`.
            status: ``"queued"`` (default: for workers to claim) or ``"running"`` (a foreground run, started now,
                which claims the trials itself with ``claim_trials(..., experiment_id=...)``).
            item_limit: Each trial runs only its first ``item_limit`` items (a tune's first round); None: all.

        Returns:
            The new experiment's id.

        Raises:
            ValueError: ``status`` is neither ``"queued"`` nor ``"running"``.
        """
        ...

    def record_environment(self, experiment_id: int, environment: dict[str, Any]) -> None:
        """Replace the experiment's versions, git commit and hardware with those of the host that runs it.

        Args:
            experiment_id: The experiment.
            environment: As for :meth:`create_experiment`: ``versions``, ``git_commit``, ``hardware``.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
        """
        ...

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        """One experiment with the counts of its trials by status and of their items.

        Args:
            experiment_id: The experiment.

        Returns:
            Its record; ``trials_*`` count its trials by status, ``items_total`` / ``items_done`` sum theirs.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
        """
        ...

    def list_experiments(self, status: str | None = None, search: str | None = None, tag: str | None = None,
                         limit: int = 100, offset: int = 0, order: str = "-created_at") -> list[ExperimentRecord]:
        """A page of experiments, filtered and ordered, each with its trial and item counts.

        Args:
            status: Only experiments with this status (one of ``STATUSES``); None: any.
            search: Only those whose name, notes or model hold this substring, case-insensitively; None or "": all.
            tag: Only those with exactly this tag; None: any.
            limit: At most this many experiments (the page size).
            offset: Skip this many first (the page's start).
            order: A field of ``ORDER_FIELDS`` (``id``, ``name``, ``status``, ``created_at``, ``started_at``,
                ``finished_at``), prefixed ``-`` for descending (default: newest first).  NULLs sort last either
                way; ties go by id in the same direction.

        Returns:
            The page's records, counts as in :meth:`get_experiment`.

        Raises:
            ValueError: An unknown ``status`` or ``order``.
        """
        ...

    def set_notes(self, experiment_id: int, notes: str) -> str:
        """Replace the experiment's notes, secrets masked before they are written (no page, export or report
        can show them).

        Args:
            experiment_id: The experiment.
            notes: Free text, as a spec's ``notes``: at most ``MAX_NOTES_CHARS`` (10,000) characters, each
                printable or a newline or tab.

        Returns:
            The notes as stored, after :func:`kvlab.secrets.redact` (a URL's password or a known key masked).

        Raises:
            StoreError: The notes are too long or hold another control character (nothing is written).
            ExperimentNotFoundError: No experiment ``experiment_id``.
        """
        ...

    def cancel_experiment(self, experiment_id: int) -> int:
        """Cancel the experiment: its queued and running trials, it, and its tune if one is running.

        Results already stored are kept.  Workers running its trials learn of it from :meth:`heartbeat`, and
        :meth:`add_item_result` takes no more results for them.

        Args:
            experiment_id: The experiment.

        Returns:
            How many trials were cancelled.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
            StoreError: It has already ended (done, failed or cancelled).
        """
        ...

    def rerun_experiment(self, experiment_id: int, environment: dict[str, Any] | None = None) -> int:
        """Queue a new experiment with the same spec and fresh trials (on all items), and log that it is a rerun.

        Args:
            experiment_id: The experiment to run again (a sweep: a tune is resumed or started anew instead).
            environment: As for :meth:`create_experiment`; None: the original's versions, git commit and
                hardware (the worker that runs it records its own).

        Returns:
            The new experiment's id.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
            StoreError: It is a tune.
        """
        ...

    def delete_experiment(self, experiment_id: int) -> None:
        """Delete the experiment with all that is stored of it: trials, item results, load levels, telemetry,
        events, and its tune.  A worker still running one of its trials learns of it from :meth:`heartbeat`.

        Args:
            experiment_id: The experiment.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
        """
        ...

    def trials(self, experiment_id: int) -> list[TrialRecord]:
        """The experiment's trials.

        Args:
            experiment_id: The experiment.

        Returns:
            Its trials in position order: the baseline (position 0) first.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
        """
        ...

    def get_trial(self, trial_id: int) -> TrialRecord:
        """One trial.

        Args:
            trial_id: The trial.

        Returns:
            Its record.

        Raises:
            TrialNotFoundError: No trial ``trial_id``.
        """
        ...


class WorkQueue(Protocol):
    """Trials as work: claimed by one worker at a time, kept alive by heartbeats, released, finished, and
    taken back from workers gone silent."""

    def claim_trials(self, worker_id: str, max_trials: int = 4, experiment_id: int | None = None,
                     exclude: Collection[int] = ()) -> list[TrialRecord]:
        """Atomically take queued trials of ONE experiment, lowest position first; two workers never get the
        same trial.

        Several configs of one experiment go together because the embedded engine shares each item's prefill
        across them.  Claimed trials become running, owned by ``worker_id``, heartbeat now, attempts + 1 (an
        earlier start time is kept, an earlier error and end cleared); their experiment, if not started yet,
        becomes running, started now.

        Args:
            worker_id: The claiming worker's id (``host-pid-xxxxxx``); it owns the trials from now on.
            max_trials: At most this many trials, at least 1.
            experiment_id: Claim only from this experiment (a foreground run); None: from the oldest (lowest id)
                with queued trials.
            exclude: Ids of experiments to pass over (those the worker could not run lately).

        Returns:
            The claimed trials in position order, as claimed; [] when nothing is queued.

        Raises:
            ValueError: ``max_trials`` < 1.
        """
        ...

    def heartbeat(self, worker_id: str, trial_ids: Iterable[int]) -> set[int]:
        """Mark the worker's trials alive (so :meth:`requeue_stale` leaves them be) and say which it lost.

        Args:
            worker_id: The worker.
            trial_ids: The trials it is running.

        Returns:
            Those of ``trial_ids`` not running under ``worker_id`` any more (cancelled, requeued, failed by stale
            recovery, claimed by another worker, deleted): the worker stops them.  Empty when it owns them all.
        """
        ...

    def release_trials(self, worker_id: str, trial_ids: Iterable[int], reason: str) -> list[int]:
        """Give trials back to the queue because their worker cannot run them (a problem of its host, not of the
        spec).

        Of ``trial_ids``, those still running under ``worker_id`` become queued for any worker, keeping their
        item results (the next worker skips those items); the others (ended, cancelled, taken away meanwhile)
        are left alone.  One warning event per experiment names the worker and the reason.

        Args:
            worker_id: The worker giving them back.
            trial_ids: The trials to give back.
            reason: Why its host cannot run them (in the event).

        Returns:
            The released trials' ids, ascending.
        """
        ...

    def set_items_total(self, trial_id: int, n: int) -> None:
        """Record how many items the trial has in all (``items_total``, the denominator of its progress).

        Args:
            trial_id: The trial.
            n: Its number of items.

        Raises:
            TrialNotFoundError: No trial ``trial_id``.
        """
        ...

    def finish_trial(self, trial_id: int, status: str, error: str | None = None,
                     worker_id: str | None = None) -> bool:
        """End a trial and log it; when it was its experiment's last queued or running trial (and no tune of it
        is running), the experiment ends too: failed if any trial failed, else cancelled if any was, else done.

        Args:
            trial_id: The trial.
            status: ``"done"``, ``"failed"`` or ``"cancelled"``.
            error: Why it failed, stored redacted; None: no error.
            worker_id: Finish it only if this worker still owns it; None: whoever does.

        Returns:
            True if it ended now; False, changing nothing, when it had already ended (e.g. cancelled meanwhile)
            or ``worker_id`` no longer owns it.

        Raises:
            ValueError: ``status`` is not one of those three.
            TrialNotFoundError: No trial ``trial_id``.
        """
        ...

    def requeue_stale(self, stale_after_s: float = 60, on_stale: str = "requeue") -> list[int]:
        """Take back the running trials of workers gone silent, in all experiments, with an event for each.

        Args:
            stale_after_s: A running trial is stale when its last heartbeat (else its claim) is older than this
                many seconds.
            on_stale: ``"requeue"`` (default): back to queued for any worker, keeping its item results
                (:meth:`done_item_keys` lets the next worker skip them); ``"fail"``: failed with the error
                "worker stopped heartbeating", its experiment ending as in :meth:`finish_trial` when that was
                its last active trial.

        Returns:
            The recovered trials' ids, by experiment id, then position.

        Raises:
            ValueError: ``on_stale`` is neither ``"requeue"`` nor ``"fail"``.
        """
        ...


class Results(Protocol):
    """Item results: each (trial, item, task) stored once, so a requeued trial skips what is done; and the load
    levels of a ``[load]`` table, each (trial, mode, level) once."""

    def add_item_result(self, trial_id: int, result: ItemResult) -> bool:
        """Store one item's result and count it in the trial's ``items_done``.

        Args:
            trial_id: The trial it belongs to.
            result: The result; its error is stored redacted.

        Returns:
            True if stored; False, changing nothing, if the trial already has this (item, task), or was cancelled
            or failed meanwhile: no evaluation counts after a cancel (a worker that gets False for that reason
            stops the trial at once, not at its next heartbeat).

        Raises:
            TrialNotFoundError: No trial ``trial_id``.
        """
        ...

    def done_item_keys(self, trial_id: int) -> set[tuple[str, str]]:
        """What the trial has already done, so that a resumed trial skips it.

        Args:
            trial_id: The trial.

        Returns:
            The ``(item_id, task)`` of each result it has; empty for a trial without any (or no such trial).
        """
        ...

    def item_results(self, experiment_id: int, trial_id: int | None = None) -> list[ItemResult]:
        """The item results of an experiment, or of one of its trials.

        Args:
            experiment_id: The experiment.
            trial_id: Only this trial's; None: all its trials'.

        Returns:
            The results in trial position, then insertion order; [] when there are none.
        """
        ...

    def add_load_level(self, trial_id: int, mode: str, level: float, result: dict[str, Any]) -> bool:
        """Store one load level measured against a trial's server.

        Args:
            trial_id: The trial.
            mode: The load's mode (:attr:`kvlab.load.metrics.LevelResult.mode`): ``"closed"`` (``level``
                clients) or ``"open"`` (``level`` requests per second).
            level: The number of clients or the request rate.
            result: :class:`kvlab.load.metrics.LevelResult`'s dict; its ``first_error`` is stored redacted.

        Returns:
            True if stored; False, changing nothing, if the trial already has this (mode, level), or was cancelled
            or failed meanwhile (as :meth:`add_item_result`).

        Raises:
            TrialNotFoundError: No trial ``trial_id``.
        """
        ...

    def load_levels(self, experiment_id: int, trial_id: int | None = None) -> list[LoadLevelRecord]:
        """The load levels of an experiment, or of one of its trials.

        Args:
            experiment_id: The experiment.
            trial_id: Only this trial's; None: all its trials'.

        Returns:
            The levels in trial position, then mode and level; [] when there are none.
        """
        ...


class TelemetrySink(Protocol):
    """Telemetry samples (GPU, process, KV bytes), written in batches and read back by time."""

    def add_telemetry(self, rows: Sequence[TelemetrySample]) -> None:
        """Store a batch of samples, all or none (nothing for an empty batch).

        Args:
            rows: The samples, of any experiments; each ``phase`` one of ``PHASES``, each ``source`` one of
                ``SOURCES``.

        Raises:
            ValueError: A sample's phase or source is unknown (nothing is stored).
            ExperimentNotFoundError: A sample's experiment or trial does not exist (deleted meanwhile?).
        """
        ...

    def telemetry(self, experiment_id: int, trial_id: int | None = None, since_ts: float | None = None,
                  limit: int | None = None) -> list[TelemetrySample]:
        """An experiment's samples, oldest first.

        Args:
            experiment_id: The experiment.
            trial_id: Only this trial's samples; None: all the experiment's.
            since_ts: Only samples later than this (unix seconds: for polling); None: from the first.
            limit: Only the latest ``limit`` samples; None: all.

        Returns:
            The samples in time order (by ``ts``, then as stored); [] when there are none.
        """
        ...


class EventLog(Protocol):
    """An experiment's events, secrets redacted before they are stored."""

    def log_event(self, experiment_id: int, message: str, level: str = "info",
                  trial_id: int | None = None) -> None:
        """Add a line, timestamped now, to the experiment's log.

        Args:
            experiment_id: The experiment.
            message: The line; stored redacted (:func:`kvlab.secrets.redact`).
            level: ``"info"`` (default), ``"warning"`` or ``"error"`` (``LEVELS``).
            trial_id: The trial it is about; None: the experiment as a whole.

        Raises:
            ValueError: An unknown ``level``.
            ExperimentNotFoundError: The experiment or the trial does not exist (deleted meanwhile?).
        """
        ...

    def events(self, experiment_id: int) -> list[EventRecord]:
        """The experiment's log.

        Args:
            experiment_id: The experiment.

        Returns:
            Its events, oldest first (by ``ts``, then as stored); [] when there are none.
        """
        ...


class Tunes(Protocol):
    """A tune's search state: its driver, its candidates and their verdicts, its answer."""

    def start_tune(self, experiment_id: int, grid_points: int, grid_item_evals: int,
                   driver_id: str | None) -> None:
        """Record a running search on a new experiment, whose Optuna study is ``kvlab-experiment-<id>``; while it
        runs, the experiment stays open between rounds.

        Args:
            experiment_id: The experiment (created with the first round's ``item_limit``).
            grid_points: How many configs its search space holds.
            grid_item_evals: How many item evaluations the full grid would take (what the tune is compared with).
            driver_id: Its driver, seen now; None: the driver that takes it over later (:meth:`take_over_tune`).

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
            StoreError: It has a tune already (running or ended); nothing changes.
        """
        ...

    def take_over_tune(self, experiment_id: int, driver_id: str, stale_after_s: float = ...) -> str | None:
        """Become the driver of a running tune (``kvlab tune --resume``, or the first driver of a new one).

        Args:
            experiment_id: The tune's experiment.
            driver_id: The new driver (``host-pid-xxxxxx``), seen now.
            stale_after_s: A driver silent for this many seconds is gone (default ``DRIVER_STALE_S``, 60 s).

        Returns:
            The driver replaced (None: it had none; ``driver_id`` itself when it drove it already).

        Raises:
            TuneBusyError: Another driver is alive: it sent a heartbeat within ``stale_after_s`` and is not a
                process of this host that no longer exists (a SIGKILLed one).
            StoreError: The experiment has no tune (a sweep), or its tune has ended.
            ExperimentNotFoundError: No experiment ``experiment_id``.
        """
        ...

    def requeue_orphans(self, experiment_id: int) -> list[int]:
        """Requeue the experiment's running trials whose worker was a process of this host that is gone (a
        SIGKILLed ``kvlab tune`` takes its in-process worker with it): at once, not after the stale timeout.

        Item results are kept; a warning event is logged for each.

        Args:
            experiment_id: The experiment.

        Returns:
            The requeued trials' ids.
        """
        ...

    def tune_heartbeat(self, experiment_id: int, driver_id: str) -> bool:
        """Mark the tune's driver alive, so that no other driver takes it over.

        Args:
            experiment_id: The tune's experiment.
            driver_id: The driver.

        Returns:
            True if marked; False when ``driver_id`` no longer drives the tune (taken over) or the tune has ended
            (or does not exist): the driver stops.
        """
        ...

    def add_candidates(self, experiment_id: int, candidates: Sequence[tuple[KVCacheConfig, int | None]],
                       item_limit: int) -> list[int]:
        """Queue a round: one trial per candidate after the experiment's last, each with an active candidate row
        at rung 0; a queued experiment becomes running, and the round is logged.

        Args:
            experiment_id: The tune's experiment.
            candidates: ``(config, Optuna trial number or None)`` pairs; none: nothing happens.
            item_limit: Each trial runs only its first ``item_limit`` items.

        Returns:
            The new trials' ids, in the order of ``candidates``.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``.
            StoreError: The experiment has ended: it takes no new trials.
        """
        ...

    def track_trial(self, experiment_id: int, trial_id: int, number: int | None = None) -> None:
        """Give an existing trial (the baseline) an active candidate row at rung 0, so its progress shows with the
        candidates'; nothing changes if it has one.

        Args:
            experiment_id: The tune's experiment.
            trial_id: The trial.
            number: Its Optuna trial number; None: none (the baseline).

        Raises:
            StoreError: The experiment has no trial ``trial_id``.
        """
        ...

    def extend_trials(self, trial_ids: Sequence[int], item_limit: int, rung: int | None = None) -> list[int]:
        """Promote trials to more items: set their item limit, and requeue those that are done, keeping their
        results (the worker skips the items they have).

        Args:
            trial_ids: The trials; none: nothing happens.
            item_limit: Their new item limit (set as given: a promotion raises it).
            rung: Their candidate rows' new rung; None: unchanged.

        Returns:
            The ids of the trials requeued (those that were done; others keep their status).

        Raises:
            StoreError: A trial does not exist, or is not in a running tune (a sweep's, or one of a tune that has
                ended: no worker may run it again); nothing changes.
        """
        ...

    def judge_candidate(self, trial_id: int, **verdict: Any) -> None:
        """Record the driver's latest verdict on a candidate, timestamped now (``judged_at``).

        Args:
            trial_id: The candidate's trial; one without a candidate row is left alone.
            **verdict: The fields of :class:`~kvlab.store.records.CandidateRecord` to set, e.g. ``state`` (one of
                ``CANDIDATE_STATES``), ``reason``, ``judged_items``, ``accuracy``, ``diff``, ``acceptable``.

        Raises:
            StoreError: A field the record does not have (its keys and ``judged_at`` included), or a state not
                in ``CANDIDATE_STATES``; nothing is written.
        """
        ...

    def finish_tune(self, experiment_id: int, state: str, recommendation: dict[str, Any] | None,
                    note: str | None) -> None:
        """End a running search, and its experiment with it.

        A tune that has already ended keeps its ending (nothing changes): the store's cancel
        (:meth:`~Experiments.cancel_experiment`) ends it first, and its driver's own "cancelled" when it notices
        must not overwrite when and why it ended.  Otherwise the tune ends and is logged.  A ``"done"`` tune
        leaves the experiment to end as after its last trial (failed if any failed, else cancelled if any was,
        else done; at once if none is queued or running).  A ``"cancelled"`` or ``"failed"`` one cancels the
        experiment's queued and running trials (no worker runs a trial of a search that has ended) and ends the
        experiment so at once, even one whose trials had all finished, unless it had already failed or been
        cancelled.

        Args:
            experiment_id: The tune's experiment.
            state: How the search ended: ``"done"``, ``"cancelled"`` or ``"failed"``.
            recommendation: Its answer; None: none.
            note: Why it ended as it did (in the event; for ``"failed"``, also the experiment's error); None: none.

        Raises:
            ExperimentNotFoundError: No experiment ``experiment_id``, or it has no tune.
        """
        ...

    def tune(self, experiment_id: int) -> TuneRecord | None:
        """The experiment's tune.

        Args:
            experiment_id: The experiment.

        Returns:
            Its tune's record; None for a plain experiment (or none of that id).
        """
        ...

    def candidates(self, experiment_id: int) -> list[CandidateRecord]:
        """The tune's latest verdict on each of its trials that has a candidate row (the baseline's included).

        Args:
            experiment_id: The tune's experiment.

        Returns:
            The candidates in trial id order; [] for a plain experiment.
        """
        ...

    def study_storage_url(self) -> str:
        """Where the store's Optuna studies live: beside the store, never in its tables (Optuna's ``trials`` and
        ``alembic_version`` tables would clash with kvlab's).  On PostgreSQL, creates the studies' schema if
        missing.

        Returns:
            An Optuna storage URL, password included: for Optuna only, never shown or stored.  On PostgreSQL it is
            the store's URL with the studies' schema as its search path; its other connection ``options`` kept.

        Raises:
            ValueError: The store is an in-memory SQLite database, which a tune cannot use.
        """
        ...


class Integrity(Protocol):
    """The store itself: where it is (``url``, as shown: a password masked), its schema and whether it is still
    there to be written."""

    url: str

    def schema_revision(self) -> str | None:
        """The database's schema revision.

        Returns:
            Its alembic revision (compare ``kvlab.store.migrate.head_revision()``); None: no kvlab schema.

        Raises:
            StoreError: The revision cannot be read (e.g. several rows in ``alembic_version``).
        """
        ...

    def check_schema(self) -> None:
        """Check that the schema is at the revision this kvlab's code expects.

        Raises:
            SchemaOutdatedError: The database has no kvlab schema, or an older one (``kvlab db upgrade``).
            StoreError: It is another application's database, or a newer kvlab's.
        """
        ...

    def upgrade(self, revision: str = "head") -> tuple[str | None, str | None]:
        """Migrate the schema (``alembic upgrade``) under a lock, so processes starting together migrate once.

        Args:
            revision: The alembic revision to reach; ``"head"`` (default): this kvlab's latest.

        Returns:
            The revisions before and after (None: no kvlab schema).

        Raises:
            StoreError: It is another application's database or a newer kvlab's, or kvlab's migrations are
                missing (kvlab not installed from a checkout).
        """
        ...

    def integrity_check(self) -> str:
        """Check the database file for corruption.

        Returns:
            SQLite's ``PRAGMA integrity_check`` report, one line per problem, ``"ok"`` when sound; always
            ``"ok"`` on PostgreSQL (nothing is checked).
        """
        ...

    def check_intact(self) -> None:
        """Check that the SQLite file this store opened is still the one it writes to: deleted, replaced or
        made read-only, SQLite would go on writing to the old inode, or fail, silently.

        A stat and an access check, cheap enough for every heartbeat; nothing is checked on PostgreSQL (the
        pool reconnects to a restarted server) or in memory.

        Raises:
            StoreLost: The file was deleted or replaced, or it (or its ``-wal`` file) was writable when opened
                and no longer is.
        """
        ...

    def close(self) -> None:
        """Release the store's database connections."""
        ...


@runtime_checkable
class ExperimentStore(Experiments, WorkQueue, Results, TelemetrySink, EventLog, Tunes, Integrity, Protocol):
    """Every role: what a second implementation of the store would provide."""
