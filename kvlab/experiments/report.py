"""Plain-text tables of experiment summaries for the terminal."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from kvlab.analysis.noise_floor import floor_lines, floor_notes, noise_floor, under_load_lines
from kvlab.analysis.summary import (
    ConfigSummary,
    Decision,
    breakdown,
    decide,
    length_group,
    natural_key,
    question_rank,
    short_of_budget,
)
from kvlab.core.load_spec import LoadTarget
from kvlab.core.results import TEACHER_BASELINE_SAMPLE, GenerationKV, ItemResult
from kvlab.core.units import MIB
from kvlab.store.records import LoadLevelRecord


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value * scale, spec)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def summary_table(summaries: Sequence[ConfigSummary]) -> str:
    has_ppl = any(s.perplexity is not None for s in summaries)
    has_fidelity = any(s.mean_kl is not None for s in summaries)
    headers = ["config", "n", "accuracy", "95% CI", "diff vs base [95% CI]", "accept", "p vs base", "KV MiB",
               "ratio", "kept", "TTFT ms", "TPOT ms"]
    headers += ["ppl"] if has_ppl else []
    headers += ["mean KL [95% CI]", "p99 KL", "agree [95% CI]"] if has_fidelity else []
    rows = []
    for s in summaries:
        ci = f"[{s.ci_low:.2f}, {s.ci_high:.2f}]" if s.ci_low is not None else "-"
        diff = (f"{s.diff_estimate:+.3f} [{s.diff_ci_low:+.2f}, {s.diff_ci_high:+.2f}]"
                if s.diff_estimate is not None else "-")
        verdict = "-" if s.non_inferior is None else ("yes" if s.non_inferior else "no")
        row = [s.config_name, str(s.n_items), _fmt(s.accuracy, ".3f"), ci, diff, verdict, _fmt(s.p_value, ".3f"),
               ("≈" if s.kv_bytes_estimated else "") + _fmt(s.physical_kv_bytes, ".2f", 1 / MIB),
               ("≈" if s.kv_bytes_estimated else "") + _fmt(s.compression_ratio, ".2f") + "x",
               _fmt(s.kept_fraction, ".0%"), _fmt(s.ttft_s, ".0f", 1000), _fmt(s.tpot_s, ".1f", 1000)]
        row += [_fmt(s.perplexity, ".2f")] if has_ppl else []
        if has_fidelity:
            row += ([f"{s.mean_kl:.3g} [{s.kl_ci_low:.3g}, {s.kl_ci_high:.3g}]", _fmt(s.p99_kl, ".3g"),
                     f"{s.agreement:.1%} [{s.agreement_ci_low:.0%}, {s.agreement_ci_high:.0%}]"]
                    if s.mean_kl is not None else ["-", "-", "-"])
        rows.append(row)
    return _table(headers, rows)


def verdict_table(summaries: Sequence[ConfigSummary]) -> str:
    """Each config's verdict on each task, the criterion that judged it and why."""
    rows = [[s.config_name, v.task, {True: "yes", False: "no", None: "-"}[v.accepted], v.criterion, v.reason]
            for s in summaries for v in s.task_verdicts]
    return _table(["config", "task", "accept", "by", "why"], rows)


def length_table(results: Sequence[ItemResult], baseline_name: str) -> str:
    """Accuracy per config (rows) and context length (columns)."""
    groups = breakdown(results, lambda r: (r.task, length_group(r)), baseline_name)
    keys = sorted(groups, key=natural_key)
    names = list(dict.fromkeys(r.config_name for r in results))
    headers = ["config"] + [f"{task}@{length}" for task, length in keys]
    cells = {(k, s.config_name): s.accuracy for k in keys for s in groups[k]}
    rows = [[name] + [_fmt(cells.get((k, name)), ".2f") for k in keys] for name in names]
    return _table(headers, rows)


def rank_table(results: Sequence[ItemResult], baseline_name: str) -> str:
    """Accuracy and median TTFT per config (rows) and question rank (columns) of the questions that
    shared a context ("" when none did): rank 0 carries the prefill and the compression."""
    shared = [r for r in results if question_rank(r) is not None]
    if not shared:
        return ""
    groups = breakdown(shared, question_rank, baseline_name)
    names = list(dict.fromkeys(r.config_name for r in shared))
    cells = {(rank, s.config_name): s for rank in groups for s in groups[rank]}
    rows = [[name] + [f"{_fmt(s.accuracy, '.2f')} / {_fmt(s.ttft_s, '.0f', 1000)} ms" if (s := cells.get((rank, name)))
                      else "-" for rank in groups] for name in names]
    return _table(["config"] + [f"question {rank + 1}" for rank in groups], rows)


def floor_table(results: Sequence[ItemResult], baseline_name: str) -> str:
    """Per task and length: the baseline's accuracy, the task's chance floor and what each of its
    shortcuts (e.g. "answer with the first number") scores on the same items."""
    from kvlab.core.tasks import chance_floor_text

    groups: dict[tuple[str, str], list[ItemResult]] = {}
    for r in results:
        if r.config_name == baseline_name:
            groups.setdefault((r.task, length_group(r)), []).append(r)
    rows = []
    for (task, length), mine in sorted(groups.items(), key=lambda g: natural_key(g[0])):
        scores = [r.score for r in mine if r.score is not None]
        shortcuts: dict[str, list[float]] = {}
        for r in mine:
            for name, value in r.extra.get("shortcuts", {}).items():
                shortcuts.setdefault(name, []).append(value)
        measured = ", ".join(f"{name} {sum(v) / len(v):.2f}" for name, v in shortcuts.items()) or "-"
        rows.append([f"{task}@{length}", _fmt(sum(scores) / len(scores) if scores else None, ".2f"),
                     chance_floor_text(task), measured])
    return _table(["task", "baseline", "chance floor", "shortcuts on these items"], rows)


def generation_table(results: Sequence[ItemResult]) -> str:
    """Once a config compresses during generation, every config's cache at the end of the answer, its
    peak between passes, the final ratio and bytes per token seen, means over items ("" otherwise)."""
    if not any((r.config or {}).get("decode") for r in results):
        return ""
    rows = []
    for name in dict.fromkeys(r.config_name for r in results):
        traces = [GenerationKV.from_dict(g) for r in results
                  if r.config_name == name and r.error is None and (g := (r.extra or {}).get("generation_kv"))]
        if traces:
            fmean = statistics.fmean
            rows.append([name, f"{fmean(t.final_tokens for t in traces):.0f}",
                         _fmt(fmean(t.final_bytes for t in traces), ".2f", 1 / MIB),
                         _fmt(fmean(t.peak_bytes for t in traces), ".2f", 1 / MIB),
                         _fmt(fmean(t.final_ratio for t in traces), ".2f") + "x",
                         f"{fmean(t.bytes_per_token for t in traces):,.0f}"])
    headers = ["config", "tokens seen", "final MiB", "peak MiB", "final ratio", "bytes/token"]
    return _table(headers, rows) if rows else ""


def decision_text(decision: Decision) -> str:
    """The sweet spot (or why there is none) and the rule that chose it."""
    spot = decision.sweet_spot
    head = (f"sweet spot: {spot.config_name} at {spot.compression_ratio:.2f}x (decided by {spot.decided_by})"
            if spot is not None else f"sweet spot: none ({decision.note})")
    few = f"\nfew items: the sweet spot {decision.few_items_note()}" if decision.few_items else ""
    bound = f"\n{decision.bound}" if decision.bound else ""
    return f"{head}{few}{bound}\nrule: {decision.rule}"


def budget_notes(summaries: Sequence[ConfigSummary]) -> list[str]:
    """One line per config that frees less memory than its budget and formats suggest, and why."""
    return [f"{s.config_name}: {s.compression_ratio:.2f}x measured, its budget and formats suggest "
            f"{s.budget_ratio:.2f}x; the rest is {'; '.join(causes)}" for s, causes in short_of_budget(summaries)]


def render(summaries: Sequence[ConfigSummary], results: Sequence[ItemResult], baseline_name: str,
           decision: Decision | None = None, load: Sequence[LoadLevelRecord] = (),
           target: LoadTarget | None = None) -> str:
    """The whole terminal report; ``decision`` defaults to :func:`decide` at the default margin; ``load``: the
    load levels of a ``[load]`` table, shown beside the cost (:mod:`kvlab.experiments.load_report`)."""
    decision = decision or decide(summaries, baseline_name)
    margins = summaries[0].margins if summaries else None
    parts = [summary_table(summaries), "", "accuracy by task and context length (tokens):",
             length_table(results, baseline_name)]
    if any(s.task_verdicts for s in summaries):
        parts += ["", "verdict per task (a config is accepted only when every task that can judge it accepts it):",
                  verdict_table(summaries)]
    if any(r.config_name == baseline_name for r in results):
        parts += ["", "can the baseline do the task, and what would a shortcut score?",
                  floor_table(results, baseline_name)]
    base = next((s for s in summaries if s.config_name == baseline_name), None)
    if base is not None and base.accuracy is not None:
        parts += ["", f"baseline accuracy {base.accuracy:.2f} on {base.n_scored} items"
                  + ("  (low: the model can hardly do this task uncompressed)" if base.accuracy < 0.5 else "")]
    parts.append(decision_text(decision))
    if (floor := noise_floor(results, baseline_name)) is not None:
        parts += ["", *floor_lines(floor, summaries, baseline_name, margins)]
    parts += floor_notes(results, baseline_name)  # "noise floor not measured (why)", where some items have none
    parts += under_load_lines(load, baseline_name)
    if load:
        parts += ["", *load_section(summaries, baseline_name, decision, load, target)]
    if notes := budget_notes(summaries):
        parts += ["", "freeing less memory than the budget suggests (measured prompt cache):", *notes]
    if any(s.kv_bytes_estimated for s in summaries):
        parts += ["", "≈ estimated, not measured: the server's KV pool bytes per token (from its /metrics or start-up "
                  "log) times the prompt tokens"]
    parts += ["", "diff vs base: paired accuracy difference (config - baseline) on the same items, 95% interval "
              "(Newcombe), pooled over tasks (a summary: the decision is per task); accept: acceptable on every task "
              f"by the rule above; KV MiB: measured bytes of {summaries[0].memory_basis if summaries else ''}; "
              "ratio = 16-bit baseline / measured; kept = fraction of context tokens kept; "
              "p: exact McNemar vs baseline on the same items"]
    ranks = rank_table(results, baseline_name)
    if ranks:
        parts += ["", "questions sharing one context (accuracy / median TTFT): the context is prefilled and "
                  "compressed once, charged to question 1; each later question starts from "
                  + ("the previous answer" if any((r.extra or {}).get("shared_context", {}).get("multi_turn")
                                                  for r in results) else "the compressed context"), ranks]
    generation = generation_table(results)
    if generation:
        parts += ["", "the cache over the generation (mean over items; ratio: the uncompressed cache of the same "
                  "tokens / the final cache):", generation]
    if any(s.mean_kl is not None for s in summaries):
        teachers = {f.teacher for r in results if (f := r.fidelity) is not None}
        how = ("estimated from a continuation the baseline's server sampled at temperature 1: per token log p(y) - "
               "log q(y), unbiased, one draw per token (so an estimate may be below 0); p99 KL: of those terms"
               if teachers == {TEACHER_BASELINE_SAMPLE} else
               "teacher-forced on the baseline's output; p99 KL: over every token")
        parts.append(f"mean KL: KL(baseline || config) in nats per token, {how}; mean over items with a 95% t interval "
                     "(the item is the unit); agree: mean over items of each item's share of tokens with the same "
                     "top-1 token as the baseline"
                     + ("" if margins is None or margins.fidelity else "; no fidelity margin is set: accuracy decides"))
        if notes := sorted({note for r in results if (note := (r.extra or {}).get("fidelity_note"))}):
            parts.append("fidelity: " + "; ".join(notes))
    return "\n".join(parts)


def load_section(summaries: Sequence[ConfigSummary], baseline_name: str, decision: Decision,
                 load: Sequence[LoadLevelRecord], target: LoadTarget | None = None) -> list[str]:
    """What each config buys under load beside what it costs, the gain of the sweet spot (else of every config)
    over the baseline, and the sweet spot that holds the load's target where it has one."""
    from kvlab.experiments.load_report import both_halves_table, gain_text, target_lines

    spot = decision.sweet_spot
    chosen = [s for s in summaries if spot is not None and s.config_name == spot.config_name] or list(summaries)
    gains = [text for s in chosen if (text := gain_text(s, baseline_name, load))]
    head = "the sweet spot buys, measured under load" if spot is not None and gains else "measured under load"
    return ["what each config buys under load (every config in the same KV budget; vllm bench serve's "
            "definitions: TTFT to the first token, TPOT per output token after it, E2EL end to end; max running / "
            "waiting: the server's own /metrics):", both_halves_table(summaries, load),
            *([f"{head}: " + "; ".join(gains)] if gains else []),
            *(target_lines(summaries, baseline_name, load, target) if target is not None else [])]
