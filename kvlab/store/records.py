"""Plain records the store hands out and takes in: detached from any session, safe to keep.

Statuses of experiments and trials: ``queued -> running -> done | failed | cancelled``; a running
trial whose worker stops heartbeating goes back to ``queued`` (or to ``failed``), and so does one
its worker releases because its host cannot run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

STATUSES = ("queued", "running", "done", "failed", "cancelled")
TERMINAL_STATUSES = ("done", "failed", "cancelled")
#: How the results of an experiment that ended without finishing are labelled wherever a verdict or a sweet
#: spot is drawn from them (the experiments list, ``kvlab show``): they rest on the items done before it ended.
PARTIAL_LABELS = {"cancelled": "partial: cancelled", "failed": "partial: failed"}
PHASES = ("load", "prefill", "compress", "decode", "idle", "score",
          "launch", "request", "bench")  # launch: a server starting; request: waiting on a server; bench: under load
SOURCES = ("cpu", "nvml", "server")
LEVELS = ("info", "warning", "error")
#: A tune's state: running while its driver may add trials (the experiment stays open meanwhile).
TUNE_STATES = ("running", "done", "cancelled", "failed")
#: A tune candidate: ``active`` (still being evaluated or waiting for its next round),
#: ``stopped`` (early, with the reason), ``complete`` (judged on every item).
CANDIDATE_STATES = ("active", "stopped", "complete")


@dataclass
class ExperimentRecord:
    """An experiment row plus counts over its trials (``trials_*``) and their items (``items_*``)."""

    id: int
    name: str
    tags: list[str]
    notes: str
    spec: dict[str, Any]
    seed: int
    model: str
    backend_kind: str
    versions: dict[str, Any]
    git_commit: str | None
    hardware: dict[str, Any]
    status: str
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    trials_total: int = 0
    trials_queued: int = 0
    trials_running: int = 0
    trials_done: int = 0
    trials_failed: int = 0
    trials_cancelled: int = 0
    items_total: int = 0
    items_done: int = 0

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def partial(self) -> str | None:
        """The label its verdicts and sweet spot carry when it ended without finishing (:data:`PARTIAL_LABELS`)."""
        return PARTIAL_LABELS.get(self.status)


@dataclass
class TrialRecord:
    """One config of an experiment's sweep; ``position`` 0 is the baseline."""

    id: int
    experiment_id: int
    position: int
    config_name: str
    config: dict[str, Any]
    status: str
    worker_id: str | None
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    error: str | None
    items_total: int | None
    items_done: int
    item_limit: int | None = None  # only the first N items (a tune's rounds); None: all

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def partial(self) -> str | None:
        """The label its verdicts and sweet spot carry when it ended without finishing (:data:`PARTIAL_LABELS`)."""
        return PARTIAL_LABELS.get(self.status)


def baseline_trial(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The baseline of an experiment's trials: the one at the lowest position (0), since the store
    writes the configs in ``ExperimentSpec.all_configs`` order, which puts the baseline first."""
    return min(trials, key=lambda t: t.position, default=None)


def baseline_name(trials: Sequence[TrialRecord]) -> str:
    """The baseline trial's config name ("baseline" before any trial is stored)."""
    base = baseline_trial(trials)
    return base.config_name if base is not None else "baseline"


@dataclass
class TelemetrySample:
    """One reading of a worker's resources.  ``ts`` is unix seconds; unknown readings stay None.

    ``phase``: what the worker was doing (``load|prefill|compress|decode|idle|score``);
    ``source``: where the readings came from (``cpu`` = psutil and kvlab's byte accounting,
    ``nvml`` = the GPU driver, ``server`` = an inference server's ``/metrics``).
    """

    experiment_id: int
    worker_id: str
    ts: float
    phase: str
    source: str
    trial_id: int | None = None
    rss_bytes: int | None = None
    cpu_percent: float | None = None
    kv_bytes: int | None = None
    gpu_memory_used_bytes: int | None = None
    gpu_memory_total_bytes: int | None = None
    gpu_utilization: float | None = None
    gpu_power_w: float | None = None
    gpu_temperature_c: float | None = None
    process_gpu_memory_bytes: int | None = None


@dataclass
class LoadLevelRecord:
    """One config's server at one load level; ``result`` is :class:`kvlab.load.metrics.LevelResult`'s dict."""

    trial_id: int
    config_name: str
    mode: str
    level: float
    result: dict[str, Any]


@dataclass
class EventRecord:
    """A line of an experiment's log (``ts`` in unix seconds)."""

    id: int
    experiment_id: int
    trial_id: int | None
    ts: float
    level: str
    message: str


@dataclass
class TuneRecord:
    """A ``kvlab tune`` search (one per experiment)."""

    experiment_id: int
    study_name: str
    state: str
    driver_id: str | None
    driver_seen_at: datetime | None
    grid_points: int
    grid_item_evals: int
    recommendation: dict[str, Any] | None
    note: str | None
    started_at: datetime
    finished_at: datetime | None


@dataclass
class CandidateRecord:
    """A tune's latest verdict on one trial (see ``kvlab.tune.judge``): accuracy and the paired
    difference to the baseline (with its 95% interval) on the first ``judged_items`` items, its mean
    KL against the baseline, and whether the sweet-spot rule accepts it on them."""

    trial_id: int
    experiment_id: int
    number: int | None
    rung: int
    state: str
    reason: str | None
    judged_items: int
    accuracy: float | None
    diff: float | None
    diff_low: float | None
    diff_high: float | None
    kv_bytes: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    judged_at: float | None
    acceptable: bool | None = None  # the sweet-spot rule on the judged items (uncorrected); None: not judged so
    mean_kl: float | None = None  # fidelity against the baseline, where measured
    kl_high: float | None = None
