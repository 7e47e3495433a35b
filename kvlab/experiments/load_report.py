"""Both halves of the tradeoff in one table: per config what compression costs (accuracy, mean KL) beside what it
buys under load (pool tokens, the most requests the server ran at once, throughput and latency at each level) --
the blog's table, measured; and the gain a config shows over the baseline, in one line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.analysis.summary import ConfigSummary
from kvlab.core.load_spec import LoadTarget
from kvlab.load.metrics import LevelResult
from kvlab.store.records import LoadLevelRecord

#: The table's columns: (header, what each row shows).
COLUMNS = ("config", "accuracy", "mean KL", "pool tokens", "level", "req/s", "out tok/s", "TTFT p50 ms",
           "TTFT p99 ms", "TPOT p50 ms", "E2EL p99 ms", "max running", "max waiting", "preempted", "errors")


def levels_by_config(records: Sequence[LoadLevelRecord]) -> dict[str, list[LevelResult]]:
    """Each config's levels, closed loop first, in increasing level."""
    found: dict[str, list[LevelResult]] = {}
    for record in records:
        found.setdefault(record.config_name, []).append(LevelResult.from_dict(record.result))
    return {name: sorted(levels, key=lambda r: (r.mode != "closed", r.level)) for name, levels in found.items()}


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def both_halves_rows(summaries: Sequence[ConfigSummary], records: Sequence[LoadLevelRecord]) -> list[dict[str, Any]]:
    """One row per (config, level), the config's cost repeated on each of its rows (a table a spreadsheet sorts)."""
    by_config = levels_by_config(records)
    rows = []
    for summary in summaries:
        for level in by_config.get(summary.config_name, []):
            server = level.server
            rows.append(dict(zip(COLUMNS, (
                summary.config_name, summary.accuracy, summary.mean_kl, level.pool_tokens, level.label,
                level.request_throughput, level.output_throughput, level.latency("ttft", "p50"),
                level.latency("ttft", "p99"), level.latency("tpot", "p50"), level.latency("e2el", "p99"),
                server.max_running, server.max_waiting, server.preemptions, level.errors), strict=True)))
    return rows


def both_halves_table(summaries: Sequence[ConfigSummary], records: Sequence[LoadLevelRecord]) -> str:
    """:func:`both_halves_rows` as text for the terminal."""
    formats = {"accuracy": ".2f", "mean KL": ".4f", "pool tokens": ",", "req/s": ".2f", "out tok/s": ".1f",
               "TTFT p50 ms": ",.0f", "TTFT p99 ms": ",.0f", "TPOT p50 ms": ",.0f", "E2EL p99 ms": ",.0f",
               "max running": ".0f", "max waiting": ".0f", "preempted": ".0f", "errors": "d"}
    cells = [list(COLUMNS)] + [[row[c] if c in ("config", "level") else _num(row[c], formats[c]) for c in COLUMNS]
                               for row in both_halves_rows(summaries, records)]
    widths = [max(len(str(line[i])) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(str(cell).ljust(width) if i < 2 or i == 4 else str(cell).rjust(width)
                               for i, (cell, width) in enumerate(zip(line, widths, strict=True))) for line in cells)


def gain_text(config: ConfigSummary, baseline_name: str, records: Sequence[LoadLevelRecord]) -> str | None:
    """What ``config`` buys over the baseline at the highest closed-loop level both ran (else the highest rate):
    the form of ``fp8_e4m3: 2.00x the pool tokens, 2.56x the output tokens/s at 4 clients, max running 4 vs 2, mean KL
    0.004 [0, 0.012]``; None where the two share no level."""
    by_config = levels_by_config(records)
    mine = {(r.mode, r.level): r for r in by_config.get(config.config_name, [])}
    base = {(r.mode, r.level): r for r in by_config.get(baseline_name, [])}
    shared = sorted(set(mine) & set(base), key=lambda key: (key[0] == "closed", key[1]))
    if not shared or config.config_name == baseline_name:
        return None
    ours, theirs = mine[shared[-1]], base[shared[-1]]
    parts = []
    if ours.pool_tokens and theirs.pool_tokens:
        parts.append(f"{ours.pool_tokens / theirs.pool_tokens:.2f}x the pool tokens")
    if theirs.output_throughput > 0:
        parts.append(f"{ours.output_throughput / theirs.output_throughput:.2f}x the output tokens/s at {ours.label}")
    if ours.server.max_running is not None and theirs.server.max_running is not None:
        parts.append(f"max running {ours.server.max_running:.0f} vs {theirs.server.max_running:.0f}")
    p99, base_p99 = ours.latency("ttft", "p99"), theirs.latency("ttft", "p99")
    if p99 is not None and base_p99:
        parts.append(f"p99 TTFT {p99 / base_p99:.2f}x")
    if config.mean_kl is not None:
        interval = (f" [{config.kl_ci_low:.3g}, {config.kl_ci_high:.3g}]"
                    if config.kl_ci_low is not None and config.kl_ci_high is not None else "")
        parts.append(f"mean KL {config.mean_kl:.3g}{interval}")
    return f"{config.config_name}: " + ", ".join(parts)


@dataclass(frozen=True)
class HalvesPoint:
    """A config's cost (mean KL with its interval, accuracy) and what it buys (output tokens/s, the most requests
    its server ran at once) at one load level: a point of the experiment page's both-halves chart."""

    config: str
    mean_kl: float | None
    kl_low: float | None
    kl_high: float | None
    accuracy: float | None
    output_throughput: float
    max_running: float | None
    level: str


def halves_points(summaries: Sequence[ConfigSummary], baseline_name: str, records: Sequence[LoadLevelRecord]
                  ) -> list[HalvesPoint]:
    """Each config at the highest level every config ran (closed loop first); the baseline's KL is 0 by
    definition.  Empty where the configs share no level."""
    by_config = levels_by_config(records)
    names = [s.config_name for s in summaries if s.config_name in by_config]
    shared = set.intersection(*({(r.mode, r.level) for r in by_config[n]} for n in names)) if names else set()
    if not shared:
        return []
    key = max(shared, key=lambda k: (k[0] == "closed", k[1]))
    points = []
    for summary in summaries:
        level = next((r for r in by_config.get(summary.config_name, []) if (r.mode, r.level) == key), None)
        if level is None:
            continue
        base = summary.config_name == baseline_name
        points.append(HalvesPoint(summary.config_name, 0.0 if base else summary.mean_kl,
                                  0.0 if base else summary.kl_ci_low, 0.0 if base else summary.kl_ci_high,
                                  summary.accuracy, level.output_throughput, level.server.max_running, level.label))
    return points


def halves_front(points: Sequence[HalvesPoint]) -> list[str]:
    """The configs no other beats on both halves: mean KL (lower) and output tokens/s (higher), by KL."""
    known = [p for p in points if p.mean_kl is not None]
    front = [p for p in known if not any(
        o.mean_kl <= p.mean_kl and o.output_throughput >= p.output_throughput  # type: ignore[operator]
        and (o.mean_kl < p.mean_kl or o.output_throughput > p.output_throughput)  # type: ignore[operator]
        for o in known)]
    return [p.config for p in sorted(front, key=lambda p: p.mean_kl or 0.0)]


def target_problem(levels: Sequence[LevelResult], target: LoadTarget) -> str | None:
    """Why a config's server missed ``target`` at its levels (None: it held it)."""
    level = next((r for r in levels if r.mode == "closed" and r.level == target.clients), None)
    if level is None:
        return f"not measured at {target.clients} clients"
    missed = []
    if target.min_output_tokens_per_s is not None and level.output_throughput < target.min_output_tokens_per_s:
        missed.append(f"{level.output_throughput:.1f} output tokens/s")
    p99 = level.latency("ttft", "p99")
    if target.max_p99_ttft_ms is not None and (p99 is None or p99 > target.max_p99_ttft_ms):
        missed.append(f"p99 TTFT {p99:,.0f} ms" if p99 is not None else "no TTFT")
    if level.errors:
        missed.append(f"{level.errors} failed requests")
    return ", ".join(missed) or None


def target_verdicts(summaries: Sequence[ConfigSummary], records: Sequence[LoadLevelRecord], target: LoadTarget
                    ) -> dict[str, str | None]:
    """Per config, why its server missed ``target`` (:func:`target_problem`; None: it held it)."""
    by_config = levels_by_config(records)
    return {s.config_name: target_problem(by_config.get(s.config_name, []), target) for s in summaries}


def sweet_spot_under_target(summaries: Sequence[ConfigSummary], baseline_name: str,
                            records: Sequence[LoadLevelRecord], target: LoadTarget) -> tuple[str | None, list[str]]:
    """The most compressed config that is acceptable (the sweet-spot rule; the baseline always is) and whose server
    held ``target``, and one line per config that missed it."""
    verdicts = target_verdicts(summaries, records, target)
    acceptable = [s for s in summaries if s.config_name == baseline_name or s.non_inferior]
    holding = [s for s in acceptable if verdicts.get(s.config_name) is None]
    chosen = max(holding, key=lambda s: s.compression_ratio, default=None)
    missed = [f"{name} missed it ({why})" for name, why in verdicts.items() if why is not None]
    return (chosen.config_name if chosen else None), missed


def target_lines(summaries: Sequence[ConfigSummary], baseline_name: str, records: Sequence[LoadLevelRecord],
                 target: LoadTarget) -> list[str]:
    """The load target's verdict in words: the sweet spot that holds it (or that none does), who missed it."""
    chosen, missed = sweet_spot_under_target(summaries, baseline_name, records, target)
    head = (f"holding the load target ({target.words()}): the sweet spot is {chosen}" if chosen else
            f"holding the load target ({target.words()}): no acceptable config does")
    return [head, *(f"  {line}" for line in missed)]
