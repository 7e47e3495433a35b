"""Plain-text tables of experiment summaries for the terminal."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvlab.analysis import DEFAULT_TOLERANCE, ConfigSummary, breakdown, sweet_spot
from kvlab.results import ItemResult

MIB = 1024 * 1024


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
    headers = ["config", "n", "accuracy", "95% CI", "p vs base", "KV MiB", "ratio", "kept", "TTFT ms", "TPOT ms"]
    headers += ["ppl"] if has_ppl else []
    rows = []
    for s in summaries:
        ci = f"[{s.ci_low:.2f}, {s.ci_high:.2f}]" if s.ci_low is not None else "-"
        row = [s.config_name, str(s.n_items), _fmt(s.accuracy, ".3f"), ci, _fmt(s.p_value, ".3f"),
               _fmt(s.physical_kv_bytes, ".2f", 1 / MIB), _fmt(s.compression_ratio, ".2f") + "x",
               _fmt(s.kept_fraction, ".0%"), _fmt(s.ttft_s, ".0f", 1000), _fmt(s.tpot_s, ".1f", 1000)]
        rows.append(row + ([_fmt(s.perplexity, ".2f")] if has_ppl else []))
    return _table(headers, rows)


def length_table(results: Sequence[ItemResult], baseline_name: str) -> str:
    """Accuracy per config (rows) and context length (columns)."""
    groups = breakdown(results, lambda r: (r.task, r.context_length), baseline_name)
    keys = sorted(groups, key=lambda k: (k[0], k[1]))
    names = list(dict.fromkeys(r.config_name for r in results))
    headers = ["config"] + [f"{task}@{length}" for task, length in keys]
    cells = {(k, s.config_name): s.accuracy for k in keys for s in groups[k]}
    rows = [[name] + [_fmt(cells.get((k, name)), ".2f") for k in keys] for name in names]
    return _table(headers, rows)


def render(summaries: Sequence[ConfigSummary], results: Sequence[ItemResult], baseline_name: str) -> str:
    parts = [summary_table(summaries), "", "accuracy by task and context length (tokens):",
             length_table(results, baseline_name)]
    base = next((s for s in summaries if s.config_name == baseline_name), None)
    if base is not None and base.accuracy is not None:
        parts += ["", f"baseline accuracy {base.accuracy:.2f} on {base.n_scored} items"
                  + ("  (low: the model can hardly do this task uncompressed)" if base.accuracy < 0.5 else "")]
    spot = sweet_spot(summaries, baseline_name)
    if spot is not None:
        parts.append(f"sweet spot: {spot.config_name} at {spot.compression_ratio:.2f}x "
                     f"(most compressed config whose 95% CI overlaps the baseline's and whose accuracy is "
                     f"within {DEFAULT_TOLERANCE:.0%} of it)")
    parts += ["", "KV MiB: measured bytes of the compressed context cache; ratio = 16-bit baseline / measured; "
              "kept = fraction of context tokens kept; p: exact McNemar vs baseline on the same items"]
    return "\n".join(parts)
