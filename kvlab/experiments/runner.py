"""Runs an experiment: items x configs -> scored ItemResults, with a summary per config.

:func:`evaluate_configs` is the one evaluation loop: :func:`run_experiment` (``kvlab run --no-store``)
and the store's workers (:mod:`kvlab.experiments.worker`, which ``kvlab run`` uses in-process) both call it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from tqdm import tqdm

from kvlab.analysis.noise_floor import floor_under_load, noise_floor
from kvlab.analysis.summary import ConfigSummary, Decision, decide, summarize
from kvlab.core.experiment_spec import ExperimentSpec, spec_to_dict
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.results import ITEM_HASH, ItemResult
from kvlab.engines.base import Engine, EngineFailure, passes
from kvlab.engines.factory import build_engine
from kvlab.experiments.provenance import environment
from kvlab.store.records import LoadLevelRecord
from kvlab.tasks import generate_items, score_item, shortcut_scores
from kvlab.tasks.scoring import ScoringError


@dataclass
class ExperimentRun:
    spec: ExperimentSpec
    configs: list[KVCacheConfig]
    results: list[ItemResult]
    engine: dict[str, Any]
    environment: dict[str, Any]
    started_at: str
    wall_s: float
    warnings: list[str] = field(default_factory=list)
    failure: str | None = None  # why the run stopped early (its results so far are kept)
    load: list[LoadLevelRecord] = field(default_factory=list)  # a [load] table's levels, as stored

    @property
    def baseline_name(self) -> str:
        return self.configs[0].label

    def summaries(self) -> list[ConfigSummary]:
        """In the spec's config order (results of a concurrent engine arrive in finishing order)."""
        order = {c.label: i for i, c in enumerate(self.configs)}
        return sorted(summarize(self.results, self.baseline_name, self.spec.margins),
                      key=lambda s: order.get(s.config_name, len(order)))

    def decision(self) -> Decision:
        return decide(self.summaries(), self.baseline_name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": spec_to_dict(self.spec), "seed": self.spec.seed, "engine": self.engine,
            "environment": self.environment, "started_at": self.started_at, "wall_s": self.wall_s,
            "warnings": self.warnings, "failure": self.failure,
            "configs": [c.model_dump(mode="json") | {"label": c.label} for c in self.configs],
            "summary": [s.to_dict() for s in self.summaries()],
            "sweet_spot": self.decision().to_dict(),
            "noise_floor": floor.to_dict() if (floor := noise_floor(self.results, self.baseline_name)) else None,
            "noise_floor_under_load": floor.to_dict() if (floor := floor_under_load(self.load, self.baseline_name))
            else None,
            "results": [r.to_dict() for r in self.results],
            "load": [asdict(level) for level in self.load],
        }


def build_items(spec: ExperimentSpec, tokenizer: Any, limit: int | None = None) -> list[TaskItem]:
    """The spec's items in order; a tune's interleaved (:func:`interleave`), so that its first
    rounds, which see only the first items, see every task and context length."""
    items = [item for task in spec.tasks for item in generate_items(task, tokenizer, spec.seed)]
    if spec.tune is not None:
        items = interleave(items)
    return items[:limit] if limit else items


def interleave(items: Sequence[TaskItem]) -> list[TaskItem]:
    """Round-robin over (task, context length) groups, each group's items in their own order."""
    groups: dict[tuple[str, int], list[TaskItem]] = {}
    for item in items:
        groups.setdefault((item.task, item.context_length), []).append(item)
    queues = list(groups.values())
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def missing_baseline(spec: ExperimentSpec) -> list[str]:
    """The warning for a spec without a baseline config (one is added: every result is judged against it)."""
    if any(c.is_baseline for c in [*spec.configs, *(spec.sweep.expand() if spec.sweep else [])]):
        return []
    return [f"no baseline config in the spec: added '{BASELINE.label}' (no quantization, no eviction)"]


def score(item: TaskItem, result: ItemResult) -> ItemResult:
    """The item's score, and (in ``extra["shortcuts"]``) what the task's shortcuts would score; the
    item's stop sequences in ``extra["stop"]`` (a server leaves them out of its text, the embedded
    engine keeps the one it stopped at: :mod:`kvlab.analysis.agreement` compares the two) and its
    content hash in ``extra["item_hash"]`` (the agreement pairs items by it, not by id alone)."""
    if item.kind == "generate" and result.error is None:
        try:
            result.score = score_item(item, result.generated)
        except ScoringError as error:  # a bound that tripped: this item's error, the run goes on
            result.error = f"scoring: {error}"
    shortcuts = shortcut_scores(item)
    if shortcuts:
        result.extra = {**result.extra, "shortcuts": shortcuts}
    if item.stop:
        result.extra = {**result.extra, "stop": list(item.stop)}
    result.extra = {**result.extra, ITEM_HASH: item.content_hash}
    return result


def evaluate_configs(engine: Engine, items: Sequence[TaskItem], configs: Sequence[KVCacheConfig],
                     on_result: Callable[[ItemResult], None], *,
                     todo: Callable[[TaskItem, KVCacheConfig], bool] = lambda item, config: True,
                     active: Callable[[KVCacheConfig], bool] = lambda config: True,
                     stopping: Callable[[], bool] = lambda: False,
                     on_pass_done: Callable[[list[KVCacheConfig]], None] = lambda configs: None) -> None:
    """Run ``items`` x ``configs`` through ``engine``, pass by pass (:func:`passes`), handing each
    scored result to ``on_result`` as it lands.

    The hooks are a worker's: ``todo`` skips the (item, config) pairs a resumed trial already has;
    ``active`` drops configs cancelled meanwhile (a pass whose configs are all gone ends at once);
    ``stopping`` ends the whole run after the current result; ``on_pass_done`` gets the configs of
    each pass that ran to its end (not when stopping).
    """
    for group in passes(engine, list(configs)):
        group = [c for c in group if active(c)]
        if not group:
            continue  # cancelled before its pass began
        work = [(item, [c for c in group if todo(item, c)]) for item in items]
        with closing(engine.evaluate_many([(item, pending) for item, pending in work if pending])) as results:
            for item, result in results:
                on_result(score(item, result))
                if stopping():
                    return
                if not any(active(c) for c in group):
                    break
        if stopping():
            return
        on_pass_done(group)


def run_experiment(spec: ExperimentSpec, engine: Engine | None = None,
                   on_result: Callable[[ItemResult], None] | None = None, progress: bool = False,
                   limit: int | None = None, items: Sequence[TaskItem] | None = None) -> ExperimentRun:
    """Run every config on every item, storing nothing.  ``on_result`` sees each scored result as it lands."""
    configs = spec.all_configs()
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    owned = engine is None
    engine = engine or build_engine(spec)
    results: list[ItemResult] = []
    failure = None
    try:
        engine.check_configs(configs)
        items = list(items) if items is not None else build_items(spec, engine.tokenizer, limit)
        engine.check_items(items)
        with tqdm(total=len(items) * len(configs), disable=not progress, unit="eval", desc=spec.name) as bar:

            def land(result: ItemResult) -> None:
                results.append(result)
                if on_result:
                    on_result(result)
                bar.update(1)

            try:
                evaluate_configs(engine, items, configs, land)
            except EngineFailure as error:
                failure = str(error)
        return ExperimentRun(spec=spec, configs=configs, results=results, engine=engine.describe(),
                             environment=environment(), started_at=started_at,
                             wall_s=time.perf_counter() - started, warnings=missing_baseline(spec), failure=failure)
    finally:
        if owned:
            engine.close()
