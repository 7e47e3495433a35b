"""Background workers: claim queued trials, run them, heartbeat, honour cancel, survive crashes.

A worker claims up to ``max_trials`` queued trials of one experiment at once, because the
embedded engine shares each item's prefill across the configs it evaluates together.  Each
item result is written as soon as it exists; a trial picked up again after a crash skips the
items it already has (the store refuses duplicates anyway).  A trial whose worker stops
heartbeating for ``stale_after_s`` is requeued (or failed) by whichever worker looks next.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kvlab.config import ConfigError, ExperimentSpec, KVCacheConfig, parse_spec
from kvlab.engines.base import Engine, EngineFailure, evaluate_all, passes
from kvlab.provenance import environment
from kvlab.runner import build_engine, build_items, score
from kvlab.store import Store
from kvlab.store.records import TrialRecord
from kvlab.telemetry import SampleContext, TelemetrySampler, detect_sources

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerSettings:
    max_trials: int = 4
    heartbeat_s: float = 5.0
    stale_after_s: float = 60.0
    on_stale: str = "requeue"  # or "fail"
    poll_s: float = 2.0
    telemetry_hz: float = 1.0
    exit_when_idle: bool = False


@dataclass
class Worker:
    store: Store
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    worker_id: str = field(default_factory=new_worker_id)
    engine_factory: Callable[[ExperimentSpec], Engine] = build_engine
    _engines: dict[tuple, Engine] = field(default_factory=dict, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Work until stopped (or, with ``exit_when_idle``, until no experiment is queued or running:
        a running one may still need this worker if another worker dies)."""
        log.info("worker %s on %s", self.worker_id, self.store.url)
        try:
            while not self._stop.is_set():
                if not self.run_once():
                    if self.settings.exit_when_idle and not self._unfinished_work():
                        return
                    self._stop.wait(self.settings.poll_s)
        finally:
            for engine in self._engines.values():
                engine.close()  # a launched vLLM/SGLang server stops with its worker
            self._engines = {}

    def _unfinished_work(self) -> bool:
        return any(self.store.list_experiments(status=status, limit=1) for status in ("queued", "running"))

    def run_once(self) -> bool:
        """Recover stale trials, claim a batch and run it; False when there was nothing to do."""
        for trial_id in self.store.requeue_stale(self.settings.stale_after_s, self.settings.on_stale):
            log.warning("trial %d had a dead worker: %s", trial_id,
                        "requeued" if self.settings.on_stale == "requeue" else "failed")
        trials = self.store.claim_trials(self.worker_id, self.settings.max_trials)
        if not trials:
            return False
        self._run_batch(trials)
        return True

    # -- one batch of trials of one experiment -------------------------------------------------

    def _engine_for(self, spec: ExperimentSpec) -> Engine:
        """Keep the model loaded across consecutive batches that use the same one."""
        key = (spec.model, spec.backend.model_dump_json(), spec.seed)
        if key not in self._engines:
            for engine in self._engines.values():
                engine.close()
            self._engines = {key: self.engine_factory(spec)}
        return self._engines[key]

    def _release_servers(self) -> None:
        """A vLLM/SGLang server kvlab launched holds a GPU: stop it when its batch ends."""
        for key, engine in list(self._engines.items()):
            if getattr(engine, "launches_servers", False):
                engine.close()
                del self._engines[key]

    def _run_batch(self, trials: list[TrialRecord]) -> None:
        experiment_id = trials[0].experiment_id
        experiment = self.store.get_experiment(experiment_id)
        context = SampleContext(experiment_id=experiment_id, worker_id=self.worker_id, phase="load")
        sampler: TelemetrySampler | None = None
        heartbeat = _Heartbeat(self.store, self.worker_id, [t.id for t in trials], self.settings.heartbeat_s)
        finished: set[int] = set()  # trials done before a later one failed
        try:
            spec = parse_spec(experiment.spec)
            engine = self._engine_for(spec)
            self.store.record_environment(experiment_id, environment())  # the host that runs it
            by_label = {KVCacheConfig(**t.config).label: t.id for t in trials}
            sampler = TelemetrySampler(
                [*detect_sources(getattr(engine, "current_kv_bytes", None)),
                 *getattr(engine, "telemetry_sources", list)()], context, self.store.add_telemetry,
                rate_hz=self.settings.telemetry_hz,
                phase_of=lambda: (getattr(engine, "phase", context.phase),
                                  by_label.get(getattr(engine, "current_config", None))),
            ).start()
            self._evaluate(spec, engine, trials, heartbeat, finished)
        except Exception as error:  # noqa: BLE001 -- any failure (bad spec, engine error) fails the batch, visibly
            message = f"{type(error).__name__}: {error}"
            if isinstance(error, ConfigError | EngineFailure):  # the message is the whole story
                log.error("batch of experiment %d failed: %s", experiment_id, message)
            else:
                log.exception("batch of experiment %d failed", experiment_id)
            failed = [t for t in trials if t.id not in heartbeat.gone and t.id not in finished]
            for trial in failed:
                self.store.finish_trial(trial.id, "failed", message, worker_id=self.worker_id)
            self.store.log_event(experiment_id, f"trials {', '.join(t.config_name for t in failed)} failed: "
                                 f"{message}", level="error")
        finally:
            heartbeat.stop()
            if sampler is not None:
                sampler.stop()
            self._release_servers()

    def _evaluate(self, spec: ExperimentSpec, engine: Engine, trials: list[TrialRecord],
                  heartbeat: _Heartbeat, finished: set[int]) -> None:
        configs = {t.id: KVCacheConfig(**t.config) for t in trials}
        engine.check_configs(list(configs.values()))
        items = build_items(spec, engine.tokenizer)
        engine.check_items(items)
        done = {t.id: self.store.done_item_keys(t.id) for t in trials}
        for trial in trials:
            self.store.set_items_total(trial.id, len(items))
        for group in passes(engine, trials):
            work = [(item, [configs[t.id] for t in group if (item.item_id, item.task) not in done[t.id]])
                    for item in items]
            by_label = {configs[t.id].label: t.id for t in group}
            results = evaluate_all(engine, [(item, todo) for item, todo in work if todo])
            for item, result in results:
                trial_id = by_label[result.config_name]
                if trial_id not in heartbeat.gone:
                    self.store.add_item_result(trial_id, score(item, result))
                if all(t.id in heartbeat.gone for t in group) or self._stop.is_set():
                    results.close()  # everything this pass runs was cancelled (or the worker is stopping)
                    break
            if self._stop.is_set():
                return  # trials stay running; they are requeued once their heartbeat is stale
            for trial in group:
                if trial.id not in heartbeat.gone:
                    self.store.finish_trial(trial.id, "done", worker_id=self.worker_id)
                    finished.add(trial.id)


class _Heartbeat:
    """Beats for the batch on a thread; ``gone`` collects trials cancelled or taken away."""

    def __init__(self, store: Store, worker_id: str, trial_ids: list[int], period_s: float):
        self.store, self.worker_id, self.trial_ids, self.period_s = store, worker_id, trial_ids, period_s
        self.gone: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvlab-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.gone |= self.store.heartbeat(self.worker_id, [t for t in self.trial_ids if t not in self.gone])
            except Exception as error:  # a missed beat is retried; staleness takes 60 s by default
                log.warning("heartbeat failed: %s", error)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

