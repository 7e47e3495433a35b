"""Runs an experiment: items x configs -> scored ItemResults, with a summary per config."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tqdm import tqdm

from kvlab.analysis import ConfigSummary, Decision, decide, summarize
from kvlab.config import BASELINE, ExperimentSpec, KVCacheConfig, spec_to_dict
from kvlab.engines.base import Engine, EngineFailure, evaluate_all, passes
from kvlab.engines.factory import build_engine
from kvlab.provenance import environment
from kvlab.results import ItemResult
from kvlab.tasks import TaskItem, generate_items, score_item, shortcut_scores


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

    @property
    def baseline_name(self) -> str:
        return self.configs[0].label

    def summaries(self) -> list[ConfigSummary]:
        """In the spec's config order (results of a concurrent engine arrive in finishing order)."""
        order = {c.label: i for i, c in enumerate(self.configs)}
        return sorted(summarize(self.results, self.baseline_name, self.spec.max_drop),
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
            "results": [r.to_dict() for r in self.results],
        }


def build_items(spec: ExperimentSpec, tokenizer: Any, limit: int | None = None) -> list[TaskItem]:
    items = [item for task in spec.tasks for item in generate_items(task, tokenizer, spec.seed)]
    return items[:limit] if limit else items


def score(item: TaskItem, result: ItemResult) -> ItemResult:
    """The item's score, and (in ``extra["shortcuts"]``) what the task's shortcuts would score."""
    if item.kind == "generate" and result.error is None:
        result.score = score_item(item, result.generated)
    shortcuts = shortcut_scores(item)
    if shortcuts:
        result.extra = {**result.extra, "shortcuts": shortcuts}
    return result


def run_experiment(spec: ExperimentSpec, engine: Engine | None = None,
                   on_result: Callable[[ItemResult], None] | None = None, progress: bool = False,
                   limit: int | None = None, items: Sequence[TaskItem] | None = None) -> ExperimentRun:
    """Run every config on every item.  ``on_result`` sees each scored result as it lands."""
    configs = spec.all_configs()
    warnings = [] if any(c.is_baseline for c in [*spec.configs, *(spec.sweep.expand() if spec.sweep else [])]) \
        else [f"no baseline config in the spec: added '{BASELINE.label}' (no quantization, no eviction)"]
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
            try:
                for group in passes(engine, configs):
                    for item, result in evaluate_all(engine, [(item, group) for item in items]):
                        results.append(score(item, result))
                        if on_result:
                            on_result(result)
                        bar.update(1)
            except EngineFailure as error:
                failure = str(error)
        return ExperimentRun(spec=spec, configs=configs, results=results, engine=engine.describe(),
                             environment=environment(), started_at=started_at,
                             wall_s=time.perf_counter() - started, warnings=warnings, failure=failure)
    finally:
        if owned:
            engine.close()
