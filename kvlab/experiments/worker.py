"""Background workers: claim queued trials, run them, heartbeat, honour cancel and delete, survive crashes.

A worker claims up to ``max_trials`` queued trials of one experiment at once, because the
embedded engine shares each item's prefill across the configs it evaluates together.  Each
item result is written as soon as it exists; a trial picked up again after a crash skips the
items it already has (the store refuses duplicates anyway).  A trial whose worker stops
heartbeating for ``stale_after_s`` is requeued (or failed) by whichever worker looks next.

:class:`~kvlab.experiments.worker_settings.WorkerSettings` checks every option when it is made, so a worker
with a bad option (``--telemetry-hz 1000``) stops with a ``ConfigError`` before it claims anything.

What goes wrong in a batch is sorted by whose problem it is:

* **the spec's**: a ``ConfigError`` from validating the stored spec, its configs or its task items
  (a quantization the model cannot take, a prompt longer than its context...).  Any host would
  refuse it, so the batch's trials fail with the message.
* **this worker's**: anything else -- the engine cannot be built here (a model not pulled on this
  host, a missing key, package or task file: :class:`~kvlab.core.errors.HostLacksError`), it crashes or runs
  out of memory, a launched server does not start, the telemetry sampler breaks.  The trials go back
  to the queue with their results kept (:meth:`Store.release_trials`, a warning event naming this
  worker and the reason), and the worker *backs off*: it leaves that experiment to other workers
  for ``backoff_s`` (10 minutes by default) and goes on with the rest of the queue.  After
  ``max_failures`` such failures in a row (3 by default) it stops with :class:`WorkerGaveUp`
  (``kvlab worker`` exits 1): a host that fails three batches running is broken, and trying the
  rest of the queue would only delay others.  With ``exit_when_idle`` a worker also stops when the
  only unfinished experiments left are ones it backed off from (``kvlab worker`` exits 1 naming them).
* **nobody's**: the experiment was cancelled or deleted (the dashboard's Delete) while it ran.  The
  worker learns it at its next heartbeat, or from the next write that finds the trial gone, drops
  the work without a fuss and claims the next experiment.

Stopping a worker (:meth:`Worker.stop`, Ctrl-C) releases its unfinished trials at once instead of
leaving them to the stale timeout.

A worker whose store is lost under it -- the SQLite file deleted, replaced or made read-only
(:meth:`Store.check_intact`, at every heartbeat and every poll, and after any failed write) -- stops
at once with :class:`~kvlab.store.StoreLost` (``kvlab worker`` and ``kvlab run`` exit 1 naming the
store) and writes nothing more: SQLite would go on writing to the deleted inode as if all were well.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field

from kvlab.core.errors import ConfigError, HostLacksError
from kvlab.core.experiment_spec import ExperimentSpec, parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.model_registry import ModelNotAvailableError
from kvlab.core.results import ItemResult
from kvlab.engines.base import Engine, EngineFailure
from kvlab.errlog import debug_enabled, log_details, one_line
from kvlab.experiments.provenance import environment
from kvlab.experiments.runner import build_engine, build_items, evaluate_configs
from kvlab.experiments.telemetry import SampleContext, TelemetrySampler, detect_sources
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.secrets import redact
from kvlab.store import ExperimentNotFoundError, ExperimentStore, StoreLost, TrialNotFoundError
from kvlab.store.database import ending_at_sigbus
from kvlab.store.records import TelemetrySample, TrialRecord

log = logging.getLogger(__name__)

#: A write that finds its trial or experiment gone: the experiment was deleted while it ran.
VANISHED = (TrialNotFoundError, ExperimentNotFoundError)


class WorkerGaveUp(RuntimeError):
    """The worker failed ``max_failures`` batches in a row for reasons of its own host and stopped."""


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class Worker:
    store: ExperimentStore
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    worker_id: str = field(default_factory=new_worker_id)
    engine_factory: Callable[[ExperimentSpec], Engine] = build_engine
    experiment_id: int | None = None  # claim only this experiment's trials (``kvlab run``'s in-process worker)
    item_limit: int | None = None  # only the first N items of each trial (``kvlab run --limit``)
    on_stored: Callable[[ItemResult], None] | None = None  # sees each result once it is stored
    _engines: dict[tuple, Engine] = field(default_factory=dict, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _backoff: dict[int, tuple[float, str]] = field(default_factory=dict, init=False)  # id: (retry at, why)
    _failures_in_a_row: int = field(default=0, init=False)
    _last_failure: str = field(default="", init=False)
    _lost: StoreLost | None = field(default=None, init=False)  # set by the heartbeat thread

    def stop(self) -> None:
        self._stop.set()

    def _stopping(self) -> bool:
        return self._stop.is_set() or self._lost is not None

    def _store_lost(self, error: StoreLost) -> None:
        """The heartbeat found the store lost: the batch stops after its current result."""
        self._lost = error

    def run(self) -> None:
        """Work until stopped (or, with ``exit_when_idle``, until no experiment it may run is queued
        or running: a running one may still need this worker if another worker dies).

        Raises :class:`WorkerGaveUp` after ``max_failures`` worker-side failures in a row, and
        :class:`~kvlab.store.StoreLost` when its store is lost."""
        log.info("worker %s on %s", self.worker_id, self.store.url)
        try:
            with ending_at_sigbus(self._sigbus_line):
                while not self._stop.is_set():
                    if not self.run_once():
                        if self.settings.exit_when_idle and not self._unfinished_work():
                            return
                        self._stop.wait(self.settings.poll_s)
        finally:
            self._close_engines()

    def _sigbus_line(self) -> str:
        """The line a SIGBUS ends this worker's process with (exit 1, see :func:`ending_at_sigbus`): the store's
        loss when its files say so (made immutable: SQLite's write to its mapped -shm file faulted), else what
        else a SIGBUS means.  Either way the trials it held stay ``running`` until any worker finds their
        heartbeat stale and requeues them, as for a killed worker."""
        requeued = "its trials are requeued once their heartbeat is stale (a worker's --stale-after-s)"
        try:
            self.store.check_intact()
        except StoreLost as error:
            return f"{error}; {requeued}"
        return (f"worker {self.worker_id} ended at a SIGBUS: a memory-mapped file failed under it (the -shm file of "
                f"the store {self.store.url}, or a model's weights: a file system that refused a write, or a file "
                f"cut short); {requeued}")

    def left_behind(self) -> dict[int, str]:
        """Unfinished experiments this worker backed off from, with why it could not run them."""
        left = {}
        for experiment_id, (_, why) in self._backing_off().items():
            try:
                if not self.store.get_experiment(experiment_id).is_terminal:
                    left[experiment_id] = why
            except ExperimentNotFoundError:
                continue
        return left

    def _backing_off(self) -> dict[int, tuple[float, str]]:
        now = time.monotonic()
        self._backoff = {key: value for key, value in self._backoff.items() if value[0] > now}
        return self._backoff

    def _unfinished_work(self) -> bool:
        skip = self._backing_off()
        if self.experiment_id is not None:
            return self.experiment_id not in skip and not self.store.get_experiment(self.experiment_id).is_terminal
        return any(experiment.id not in skip
                   for status in ("queued", "running")
                   for experiment in self.store.list_experiments(status=status, limit=len(skip) + 1))

    def run_once(self) -> bool:
        """Recover stale trials, claim a batch and run it; False when there was nothing to do."""
        self.store.check_intact()
        for trial_id in self.store.requeue_stale(self.settings.stale_after_s, self.settings.on_stale):
            log.warning("trial %d had a dead worker: %s", trial_id,
                        "requeued" if self.settings.on_stale == "requeue" else "failed")
        trials = self.store.claim_trials(self.worker_id, self.settings.max_trials, self.experiment_id,
                                         exclude=self._backing_off())
        if not trials:
            self._release_servers()
            return False
        self._run_batch(trials)
        if self._failures_in_a_row >= self.settings.max_failures:
            raise WorkerGaveUp(
                f"worker {self.worker_id} stopped after {self._failures_in_a_row} failures in a row on this host "
                f"(last: {self._last_failure}); its trials went back to the queue for other workers; "
                "details in the warnings above and in each experiment's events (`kvlab show ID`)")
        return True

    # -- one batch of trials of one experiment -------------------------------------------------

    def _engine_for(self, spec: ExperimentSpec) -> Engine:
        """Keep the model loaded across consecutive batches that use the same one."""
        key = (spec.model, spec.backend.model_dump_json(), spec.seed)
        if key not in self._engines:
            self._close_engines()
            self._engines = {key: self.engine_factory(spec)}
        return self._engines[key]

    def _close_engines(self) -> None:
        for engine in self._engines.values():
            try:
                engine.close()  # a launched vLLM/SGLang server stops with its worker
            except Exception as error:  # noqa: BLE001 -- closing must not hide why the batch ended
                log.warning("closing the engine failed: %s", one_line(str(error)))
        self._engines = {}

    def _release_servers(self) -> None:
        """A vLLM/SGLang server kvlab launched holds a GPU: stop it once this worker has nothing to claim.
        Not at the end of each batch: the next batch of the same experiment (a tune's promoted candidate,
        the rest of a sweep) may need the very server that is up, and a start takes a minute or more."""
        if any(engine.launches_servers for engine in self._engines.values()):
            self._close_engines()

    def _run_batch(self, trials: list[TrialRecord]) -> None:
        experiment_id = trials[0].experiment_id
        context = SampleContext(experiment_id=experiment_id, worker_id=self.worker_id, phase="load")
        sampler: TelemetrySampler | None = None
        heartbeat = _Heartbeat(self.store, self.worker_id, [t.id for t in trials], self.settings.heartbeat_s,
                               self._store_lost)
        finished: set[int] = set()  # trials done before a later one failed
        building = broken = False  # building: every error while the engine is built is this host's

        def unfinished() -> list[TrialRecord]:
            return [t for t in trials if t.id not in heartbeat.gone and t.id not in finished]

        try:
            spec = parse_spec(self.store.get_experiment(experiment_id).spec, stored=True)
            building = True
            engine = self._engine_for(spec)
            building = False
            self.store.record_environment(experiment_id, environment())  # the host that runs it
            # looked up by the engine's current config (None between configs: no trial)
            by_label: dict[str | None, int] = {KVCacheConfig(**t.config).label: t.id for t in trials}
            sampler = TelemetrySampler(
                [*detect_sources(engine.current_kv_bytes), *engine.telemetry_sources()], context,
                self._telemetry_writer(), rate_hz=self.settings.telemetry_hz,
                phase_of=lambda: (engine.phase, by_label.get(engine.current_config)),
            ).start()
            self._evaluate(spec, engine, trials, heartbeat, finished)
            if self._lost is not None:
                raise self._lost
            if heartbeat.gone:
                log.info("experiment %d: trial(s) %s cancelled, deleted or taken over meanwhile: dropped here",
                         experiment_id, ", ".join(map(str, sorted(heartbeat.gone))))
            if self._stop.is_set():
                self._release(experiment_id, unfinished(), "the worker was stopped")
            else:
                self._failures_in_a_row = 0
        except StoreLost:
            raise
        except VANISHED:
            self.store.check_intact()  # a replaced file has none of this worker's rows either
            log.info("experiment %d was deleted while this worker ran it: its work is dropped", experiment_id)
        except Exception as error:  # noqa: BLE001 -- sorted here: the spec's problem, or this host's
            self.store.check_intact()  # a write that failed because the store is gone: nothing to give back
            if _the_specs_fault(error) and not building:
                self._fail(experiment_id, unfinished(), error)
            else:
                broken = True  # a crashed or half-built engine is not reused
                self._back_off(experiment_id, unfinished(), self._describe(error, experiment_id))
        except BaseException:  # Ctrl-C: the trials go back to the queue now, not after the stale timeout
            self._release(experiment_id, unfinished(), "the worker was interrupted")
            raise
        finally:
            heartbeat.stop()
            if sampler is not None:
                sampler.stop()
            if broken:
                self._close_engines()

    def _evaluate(self, spec: ExperimentSpec, engine: Engine, trials: list[TrialRecord],
                  heartbeat: _Heartbeat, finished: set[int]) -> None:
        configs = [KVCacheConfig(**t.config) for t in trials]
        by_label = {config.label: trial.id for config, trial in zip(configs, trials, strict=True)}
        engine.check_configs(configs)
        items = build_items(spec, engine.tokenizer, self.item_limit)
        # A tune's trial runs only its first ``item_limit`` items (the rest, if it is promoted).
        limits = {t.id: min(len(items), t.item_limit or len(items)) for t in trials}
        every_item = len(items)
        items = items[:max(limits.values())]
        engine.check_items(items)
        position = {(item.item_id, item.task): i for i, item in enumerate(items)}
        done = {t.id: self.store.done_item_keys(t.id) for t in trials}
        for trial in trials:
            self.store.set_items_total(trial.id, limits[trial.id])

        def todo(item: TaskItem, config: KVCacheConfig) -> bool:
            trial_id, key = by_label[config.label], (item.item_id, item.task)
            return position[key] < limits[trial_id] and key not in done[trial_id]

        def store(result: ItemResult) -> None:
            trial_id = by_label[result.config_name]
            if trial_id not in heartbeat.gone:
                if self.store.add_item_result(trial_id, result):
                    if self.on_stored:
                        self.on_stored(result)
                else:  # a duplicate, or the trial ended meanwhile (cancelled): ask now, not at the next beat
                    heartbeat.beat_now()

        def finish(group: list[KVCacheConfig]) -> None:
            for config in group:
                trial_id = by_label[config.label]
                if spec.load is not None and limits[trial_id] == every_item and trial_id not in heartbeat.gone:
                    self._measure_load(spec, engine, config, items[:limits[trial_id]], trial_id, heartbeat)
                    if self._stopping():
                        return  # the caller releases the trial; its stored levels are kept and skipped on resume
                if trial_id not in heartbeat.gone:
                    self.store.finish_trial(trial_id, "done", worker_id=self.worker_id)
                    finished.add(trial_id)

        evaluate_configs(engine, items, configs, store, todo=todo,
                         active=lambda config: by_label[config.label] not in heartbeat.gone,
                         stopping=self._stopping, on_pass_done=finish)  # stopped: the caller releases the rest

    def _measure_load(self, spec: ExperimentSpec, engine: Engine, config: KVCacheConfig, items: list[TaskItem],
                      trial_id: int, heartbeat: _Heartbeat) -> None:
        """The trial's server under the spec's ``[load]`` levels it has not stored yet, each stored as it ends
        (the experiment page shows it at once); a cancel or a stop ends it after the level in progress.  A tune's
        trial comes here once it runs on every item (its last rung, :mod:`kvlab.core.load_spec`)."""
        assert spec.load is not None
        stored = self.store.load_levels(self.store.get_trial(trial_id).experiment_id, trial_id)
        done = {(level.mode, level.level) for level in stored}
        with closing(engine.measure_load(config, items, spec.load, spec.seed, done)) as levels:
            for level in levels:
                if not self.store.add_load_level(trial_id, level.mode, level.level, level.to_dict()):
                    heartbeat.beat_now()  # the trial ended meanwhile (cancelled): ask now
                if trial_id in heartbeat.gone or self._stopping():
                    return

    # -- endings --------------------------------------------------------------------------------

    def _fail(self, experiment_id: int, trials: list[TrialRecord], error: Exception) -> None:
        """The spec cannot run anywhere: fail the trials with the message (a ConfigError's message is the
        whole story, as the CLI shows it)."""
        message = redact(str(error) if isinstance(error, ConfigError) else f"{type(error).__name__}: {error}")
        log.error("experiment %d cannot run: %s", experiment_id, one_line(message))
        self._failures_in_a_row = 0  # this worker is fine
        with self._unless_vanished(experiment_id):
            for trial in trials:
                self.store.finish_trial(trial.id, "failed", message, worker_id=self.worker_id)
            if trials:
                self.store.log_event(experiment_id, f"trials {', '.join(t.config_name for t in trials)} failed: "
                                     f"{message}", level="error")

    def _back_off(self, experiment_id: int, trials: list[TrialRecord], reason: str) -> None:
        """This host cannot run the batch: give the trials back and leave the experiment to others."""
        self._release(experiment_id, trials, reason)
        self._failures_in_a_row += 1
        self._last_failure = reason
        self._backoff[experiment_id] = (time.monotonic() + self.settings.backoff_s, reason)
        log.warning("experiment %d: this worker cannot run it (%s); %d trial(s) back in the queue for other "
                    "workers; not retried here for %g s", experiment_id, reason, len(trials), self.settings.backoff_s)

    def _release(self, experiment_id: int, trials: list[TrialRecord], reason: str) -> None:
        if not trials:
            return
        try:
            self.store.release_trials(self.worker_id, [t.id for t in trials], reason)
        except VANISHED:
            pass
        except Exception as error:  # noqa: BLE001 -- e.g. the database is down: the stale timeout requeues them
            log.warning("could not release trials %s of experiment %d (%s): they are requeued once their "
                        "heartbeat is stale", [t.id for t in trials], experiment_id, one_line(str(error)))

    def _describe(self, error: Exception, experiment_id: int) -> str:
        """One line for events and logs; an unexpected error's traceback goes to kvlab's error log."""
        text = redact(f"{type(error).__name__}: {one_line(str(error))}")
        if isinstance(error, ConfigError | EngineFailure | ModelNotAvailableError | MemoryError):
            return text  # the message is the whole story
        if debug_enabled():
            log.exception("batch of experiment %d failed", experiment_id)
            return text
        path = log_details("worker", f"worker {self.worker_id}, experiment {experiment_id}", error)
        return f"{text} (traceback in {path})"

    @contextmanager
    def _unless_vanished(self, experiment_id: int) -> Iterator[None]:
        try:
            yield
        except VANISHED:
            log.info("experiment %d was deleted meanwhile", experiment_id)

    def _telemetry_writer(self) -> Callable[[list[TelemetrySample]], None]:
        def write(samples: list[TelemetrySample]) -> None:
            if self._lost is not None:
                return  # the worker is stopping: the error says why, once
            try:
                self.store.add_telemetry(samples)
            except VANISHED:  # deleted while running: the heartbeat stops the batch
                log.debug("telemetry dropped: its experiment was deleted")
        return write


class _Heartbeat:
    """Beats for the batch on a thread; ``gone`` collects trials cancelled, deleted or taken away.
    A beat first checks that the store is intact; once it is lost, ``on_lost`` hears it and the beats end."""

    def __init__(self, store: ExperimentStore, worker_id: str, trial_ids: list[int], period_s: float,
                 on_lost: Callable[[StoreLost], None]):
        self.store, self.worker_id, self.trial_ids, self.period_s = store, worker_id, trial_ids, period_s
        self.on_lost = on_lost
        self.gone: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvlab-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.store.check_intact()
                self.gone |= self.store.heartbeat(self.worker_id, [t for t in self.trial_ids if t not in self.gone])
            except StoreLost as error:
                self.on_lost(error)
                return
            except Exception as error:  # noqa: BLE001 -- a missed beat is retried; staleness takes minutes
                log.warning("heartbeat failed: %s", one_line(str(error)))

    def beat_now(self) -> None:
        """Beat at once (a write was refused: cancelled meanwhile?), so that the batch drops the trials it no
        longer owns before its next evaluation rather than at the next beat."""
        self.gone |= self.store.heartbeat(self.worker_id, [t for t in self.trial_ids if t not in self.gone])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _the_specs_fault(error: Exception) -> bool:
    """Whether an error once the engine is built is the spec's, so that no other host would do better: a
    refused spec (not a host's lack), or an engine's assertion (kvpress asserts on settings it cannot run,
    such as a decode target at or below StreamingLLM's sinks); giving those back would keep the experiment
    waiting for a worker that can never run it."""
    if isinstance(error, ConfigError):
        return not isinstance(error, HostLacksError)
    return isinstance(error, AssertionError)
