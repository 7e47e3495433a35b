"""How long a sweep will take, before it runs: trial and item counts, and a duration estimate.

The embedded engine prefills each item once per batch of configs a worker claims (they share the
prefill) and then compresses and decodes per config, so::

    time ~ load + items x (prefill(length) x batches + per_config x configs)

Default rates are measured on 2 CPU cores with SmolLM2-135M (prefill ~1.2 s at 1K tokens,
~2.6 s at 2K; ~1.2 s to compress and decode one config of one item: about 10 new tokens at
~9.6 tokens/s; ~20 s to start: the process, its imports, the model load and the worker).  With
these, the tiny example comes out at 27.8 s against 27.7 s measured by `kvlab run examples/tiny.toml`
on an idle 2-core machine.  Past results of the same model in the store, where there are any,
replace them (:func:`rates_from_results`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.results import ItemResult
from kvlab.core.tasks import TASKS, TaskSpec
from kvlab.tasks import planned_items

#: Configs a worker claims together (``kvlab worker --max-trials``' default): they share prefills.
CONFIGS_PER_CLAIM = 4
JSONL_GUESS_TOKENS = 1024


@dataclass(frozen=True)
class Rates:
    """prefill(L) = ``prefill_linear`` x K + ``prefill_quadratic`` x K^2 seconds for K = L / 1024 tokens."""

    prefill_linear: float = 1.1
    prefill_quadratic: float = 0.1
    per_config_item: float = 1.2
    load_s: float = 20.0
    source: str = "measurements of SmolLM2-135M on 2 CPU cores"

    def prefill_s(self, tokens: int) -> float:
        k = tokens / 1024
        return self.prefill_linear * k + self.prefill_quadratic * k * k


DEFAULT_RATES = Rates()


def items_per_config(spec: ExperimentSpec) -> int:
    """Items each config runs on (a jsonl file that cannot be read here counts its ``num_items``,
    or the default: the estimate stays an estimate, validation says what is wrong with the file)."""
    return sum(_planned(task) for task in spec.tasks)


def _planned(task: TaskSpec) -> int:
    planned = planned_items(task)
    return task.items_per_length if planned is None else planned


def estimate_seconds(spec: ExperimentSpec, rates: Rates = DEFAULT_RATES) -> float:
    """Wall time of the whole sweep on one worker (local workers split the cores, so more of them
    on one CPU do not finish sooner)."""
    configs = spec.all_configs()
    batches = math.ceil(len(configs) / CONFIGS_PER_CLAIM)
    total = rates.load_s
    for task in spec.tasks:
        lengths = task.context_lengths if TASKS[task.name].target_lengths else [JSONL_GUESS_TOKENS]
        per_length = _planned(task) / len(lengths)
        for length in lengths:
            total += per_length * (rates.prefill_s(length) * batches + rates.per_config_item * len(configs))
    return total


def rates_from_results(results: Sequence[ItemResult], source: str) -> Rates | None:
    """Rates scaled to what past runs of the model measured: the median ratio of measured to
    default prefill time, and the median compress + decode time per config item."""
    prefill_scales = [r.prefill_s / DEFAULT_RATES.prefill_s(r.context_tokens) for r in results
                      if r.error is None and r.context_tokens > 0 and _finite(r.prefill_s) and r.prefill_s > 0]
    per_config = [r.compress_s + r.decode_s for r in results
                  if r.error is None and _finite(r.compress_s) and _finite(r.decode_s)]
    if not prefill_scales or not per_config:
        return None
    scale = statistics.median(prefill_scales)
    return Rates(prefill_linear=DEFAULT_RATES.prefill_linear * scale,
                 prefill_quadratic=DEFAULT_RATES.prefill_quadratic * scale,
                 per_config_item=statistics.median(per_config), source=source)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
