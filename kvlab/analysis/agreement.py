"""Cross-engine agreement: the same spec run on two engines (say the embedded one and vLLM), config by config.

Two engines given the same greedy requests need not answer alike: their kernels, their dtypes (vLLM's
CPU build computes in bfloat16, the embedded engine in float32) and their formats differ (an fp8
cache is per-tensor scaled in vLLM, per block of tokens with a 16-bit residual window in kvlab).  For
each config both experiments ran (matched by name), this pairs their results item by item (task,
item id and the item's content: :func:`item_key`; the same id under another seed is another item, never
paired, and :func:`different_items` says so) and says how often the outcomes agree (same score), how
often the generated text is the same, what each engine's cache costs per context token (measured
bytes on the embedded engine, a server's pool estimate on vLLM), and each engine's fidelity to *its own*
baseline: mean KL with its 95% interval over the items, and which estimator measured it (the embedded
engine's exact KL on the greedy output, a server's sampled estimate: compare like with like).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.results import ITEM_HASH, ItemResult


@dataclass(frozen=True)
class EngineAgreement:
    """One config on two engines, over the items both ran without an error."""

    config_name: str
    items: int
    accuracy_a: float | None
    accuracy_b: float | None
    same_outcome: float | None  # fraction of items with equal scores
    same_text: float | None  # fraction of items with the same answer text (:func:`answer_text`)
    kv_bytes_a: float | None  # bytes per context token, over the items
    kv_bytes_b: float | None
    estimated_a: bool
    estimated_b: bool
    fidelity_a: EngineFidelity | None = None  # against engine A's own baseline
    fidelity_b: EngineFidelity | None = None


@dataclass(frozen=True)
class EngineFidelity:
    """A config's fidelity to its engine's baseline over the paired items: mean KL and its 95% t interval,
    top-1 agreement, and the estimator (:attr:`kvlab.core.results.Fidelity.teacher`)."""

    mean_kl: float
    kl_low: float
    kl_high: float
    agreement: float
    items: int
    teacher: str

    @classmethod
    def of(cls, results: Sequence[ItemResult]) -> EngineFidelity | None:
        fidelities = [f for r in results if (f := r.fidelity) is not None]
        if not fidelities:
            return None
        from kvlab.analysis.fidelity import FidelitySummary  # its t quantiles import scipy: only when there is one

        summary = FidelitySummary.of(fidelities)
        low, high = summary.kl_interval()
        teachers = sorted({f.teacher for f in fidelities})
        return cls(summary.mean_kl, low, high, summary.agreement, summary.items, " + ".join(teachers))

    @property
    def text(self) -> str:
        """``0.012 [0, 0.031]``: the mean KL and its interval."""
        return f"{self.mean_kl:.3g} [{self.kl_low:.3g}, {self.kl_high:.3g}]"


def answer_text(result: ItemResult) -> str:
    """The generated text as an OpenAI server returns it: cut before the first of the item's stop
    sequences (the embedded engine keeps the one it stopped at), whitespace at the ends aside."""
    text = result.generated
    for stop in result.extra.get("stop", ()):
        text = text.split(stop, 1)[0]
    return text.strip()


def item_key(result: ItemResult) -> tuple[str, str, str]:
    """(task, item id, content): results are of the same item only when all three are equal.  The content is
    the item's hash stored with the result (:attr:`kvlab.core.items.TaskItem.content_hash`); a result stored
    before kvlab kept one is known by its seed and expected answer instead (a generated item is a function of
    its seed, and two items with other answers are other items)."""
    content = result.extra.get(ITEM_HASH)
    if not isinstance(content, str):
        content = f"seed {result.seed}, answer {result.answer!r}"
    return result.task, result.item_id, content


def different_items(runs: Sequence[tuple[int, Sequence[ItemResult]]]) -> str | None:
    """One line naming the item ids that ``runs`` (experiment id, its results) share but that name other items
    in them (another content: a spec with another seed generates other prompts and answers under the same ids),
    which are never paired; None when every shared id is the same item everywhere."""
    seen: dict[tuple[str, str], dict[str, tuple[int, ItemResult]]] = {}
    for experiment_id, results in runs:
        for result in results:
            task, item_id, content = item_key(result)
            seen.setdefault((task, item_id), {}).setdefault(content, (experiment_id, result))
    differing = [(ids, by_content) for ids, by_content in seen.items() if len(by_content) > 1]
    if not differing:
        return None
    (task, item_id), by_content = differing[0]
    example = "; ".join(f"#{experiment_id} (seed {r.seed}) expects {r.answer[:40]!r}"
                        for experiment_id, r in by_content.values())
    return (f"{len(differing)} item id(s) name different items in these experiments and are not paired (their "
            f"prompts and answers differ: another seed, say, generates other items under the same ids), e.g. "
            f"{task}/{item_id}: {example}")


def _per_token(result: ItemResult) -> float | None:
    """KV bytes per context token: the engines count a prompt's tokens alike, but the embedded engine
    measures the context's cache and a server's estimate covers the whole prompt."""
    tokens = result.context_tokens
    return result.physical_kv_bytes / tokens if result.physical_kv_bytes is not None and tokens else None


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def engine_agreement(results_a: Sequence[ItemResult], results_b: Sequence[ItemResult]) -> list[EngineAgreement]:
    """Per config both result sets hold (in ``results_a``'s order), the agreement of their items."""
    def keyed(results: Sequence[ItemResult]) -> dict[tuple[str, str, str, str], ItemResult]:
        return {(r.config_name, *item_key(r)): r for r in results if r.error is None}

    a, b = keyed(results_a), keyed(results_b)
    rows = []
    for name in dict.fromkeys(r.config_name for r in results_a):
        pairs = [(a[key], b[key]) for key in a if key[0] == name and key in b]
        if not pairs:
            continue
        scored = [(x.score, y.score) for x, y in pairs if x.score is not None and y.score is not None]
        rows.append(EngineAgreement(
            config_name=name, items=len(pairs),
            accuracy_a=_mean([x for x, _ in scored]), accuracy_b=_mean([y for _, y in scored]),
            same_outcome=statistics.fmean(x == y for x, y in scored) if scored else None,
            same_text=statistics.fmean(answer_text(x) == answer_text(y) for x, y in pairs),
            kv_bytes_a=_mean([_per_token(x) for x, _ in pairs]),
            kv_bytes_b=_mean([_per_token(y) for _, y in pairs]),
            estimated_a=any(x.kv_bytes_estimated for x, _ in pairs),
            estimated_b=any(y.kv_bytes_estimated for _, y in pairs),
            fidelity_a=EngineFidelity.of([x for x, _ in pairs]), fidelity_b=EngineFidelity.of([y for _, y in pairs])))
    return rows


@dataclass(frozen=True)
class EngineConfig:
    """One config of one engine's experiment, over the items every compared experiment ran without an error:
    its accuracy, its fidelity to that engine's own baseline and its KV bytes per context token."""

    experiment_id: int
    engine: str
    config_name: str
    items: int
    accuracy: float | None
    kv_bytes: float | None
    estimated: bool
    fidelity: EngineFidelity | None


def engines_table(runs: Sequence[tuple[int, str, Sequence[ItemResult]]]) -> list[EngineConfig]:
    """Every config of every run (``(experiment id, engine, results)``, the same spec on several engines, each with
    its own formats), on the items all of the runs ran: the table that sets engines side by side even where their
    configs differ (llama.cpp's q8_0 beside the embedded engine's int8), each against its own baseline."""
    def items(results: Sequence[ItemResult]) -> set[tuple[str, str, str]]:
        return {item_key(r) for r in results if r.error is None}

    shared = set.intersection(*(items(results) for _, _, results in runs)) if runs else set()
    rows = []
    for experiment_id, engine, results in runs:
        kept = [r for r in results if r.error is None and item_key(r) in shared]
        for name in dict.fromkeys(r.config_name for r in kept):
            mine = [r for r in kept if r.config_name == name]
            rows.append(EngineConfig(
                experiment_id=experiment_id, engine=engine, config_name=name, items=len(mine),
                accuracy=_mean([r.score for r in mine]), kv_bytes=_mean([_per_token(r) for r in mine]),
                estimated=any(r.kv_bytes_estimated for r in mine), fidelity=EngineFidelity.of(mine)))
    return rows
