"""Pure figure builders: experiment data -> plotly Figure.  Every axis says its unit.

The dashboard, the HTML report and the exports (``kvlab.dashboard.chart_export``) draw the same figures.
Metrics come from :mod:`kvlab.analysis.summary`; nothing here computes one of its own.
"""

from __future__ import annotations

import html
import math
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard, cast

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.analysis.summary import FRONT_METRICS, ConfigSummary, Decision, decide, pareto_front
from kvlab.core.kv_config import BASELINE
from kvlab.core.margins import Margins
from kvlab.core.results import CacheLayout, ItemResult
from kvlab.core.tasks import TASKS
from kvlab.core.units import MIB
from kvlab.dashboard.compare_view import CompareRow
from kvlab.dashboard.formatting import Y_METRICS, fidelity_text
from kvlab.experiments.load_report import HalvesPoint
from kvlab.experiments.nodes import node_of
from kvlab.load.metrics import LevelResult
from kvlab.store.records import TelemetrySample

X_TITLES = {"bytes": "physical KV cache (MiB)", "ratio": "compression ratio (x, baseline bytes / physical bytes)"}
ACCURACY_TITLE = "accuracy (fraction correct, 95% CI)"
PHASE_COLORS = {"load": "#9e9e9e", "prefill": "#1f77b4", "compress": "#ff7f0e", "decode": "#2ca02c",
                "score": "#9467bd", "idle": "#d3d3d3",
                # launch/request: a server kvlab launched or calls; bench: that server under a [load] table's load
                "launch": "#8c564b", "request": "#17becf", "bench": "#e377c2"}
_LAYOUT: dict[str, Any] = {"template": "plotly_white", "margin": {"l": 70, "r": 30, "t": 60, "b": 60}, "height": 480}
#: The marker vocabulary of every chart (the experiment and tune pages, their exports): each symbol means one
#: thing wherever it is drawn.  The star is the chosen config -- an experiment's sweet spot, a tune's
#: recommendation (or its best so far while it runs) -- and nothing else; the baseline, where it is a point of
#: its own, is the black diamond.  ``front``: a config on an experiment's Pareto front; the rest are a tune
#: candidate's states (:mod:`kvlab.tune.progress`; ``unfinished``: left so by a tune that ended).
MARKERS: dict[str, dict[str, Any]] = {
    "chosen": {"size": 18, "symbol": "star", "color": "#ffbf00", "line": {"width": 1, "color": "#333"}},
    "baseline": {"size": 13, "symbol": "diamond", "color": "black"},
    "front": {"size": 13, "symbol": "circle-open", "color": "#d62728"},
    "complete": {"size": 10, "symbol": "circle", "color": "#1f77b4"},
    "active": {"size": 10, "symbol": "triangle-up-open", "color": "#ff7f0e", "line": {"width": 2}},
    "stopped": {"size": 8, "symbol": "x", "color": "#9e9e9e"},
    "unfinished": {"size": 9, "symbol": "square-open", "color": "#8c564b", "line": {"width": 2}},
}


def plotly_text(text: str) -> str:
    """Text from the store (config and experiment names, tags, worker ids) for a Plotly figure, which
    reads its text, hover labels, legends and titles as HTML (``<a href>`` a link, ``<span style>``
    styled, ``<br>`` a line break): ``& < >`` become the entities it shows as those characters.  The
    figures are the page's, the HTML report's and the exports' alike."""
    return html.escape(str(text), quote=False)


def _ok(value: float | None) -> TypeGuard[float]:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _x(summary: ConfigSummary, axis: str) -> float:
    return summary.physical_kv_bytes / MIB if axis == "bytes" else summary.compression_ratio


#: The y metrics of the tradeoff chart (``formatting.Y_METRICS``): the summary's value and its 95% interval.
_Y_FIELDS = {"accuracy": ("accuracy", "ci_low", "ci_high"), "KL": ("mean_kl", "kl_ci_low", "kl_ci_high"),
             "agreement": ("agreement", "agreement_ci_low", "agreement_ci_high")}
Y_TITLES = {"accuracy": ACCURACY_TITLE, "KL": "mean KL(baseline || config) per token (nats, 95% CI; lower is better)",
            "agreement": "top-1 agreement with the baseline (fraction of tokens, 95% CI)"}
assert set(Y_TITLES) == set(_Y_FIELDS) == set(Y_METRICS) == set(FRONT_METRICS)


def _y(summary: ConfigSummary, metric: str) -> float | None:
    return getattr(summary, _Y_FIELDS[metric][0])


def _plotted(summaries: Sequence[ConfigSummary], axis: str, metric: str = "accuracy") -> list[ConfigSummary]:
    return [s for s in summaries if _ok(_y(s, metric)) and _ok(_x(s, axis))]


def _error_y(summaries: Sequence[ConfigSummary], metric: str = "accuracy") -> dict[str, Any]:
    """The 95% intervals as error bars (none where an end is unknown or unbounded: one item's KL)."""
    value, low, high = _Y_FIELDS[metric]

    def gap(a: float | None, b: float | None) -> float:
        return a - b if _ok(a) and _ok(b) and math.isfinite(a - b) else 0

    return {"type": "data", "symmetric": False, "thickness": 1.2,
            "array": [gap(getattr(s, high), getattr(s, value)) for s in summaries],
            "arrayminus": [gap(getattr(s, value), getattr(s, low)) for s in summaries]}


def _hover(summaries: Sequence[ConfigSummary]) -> list[str]:
    return ["<br>".join(_hover_lines(s)) for s in summaries]


def _hover_lines(s: ConfigSummary) -> list[str]:
    """A config's figures and its verdict, in the words of the per-task rule (the pooled accuracy is a summary)."""
    lines = [f"<b>{plotly_text(s.config_name)}</b>"]
    if _ok(s.accuracy):
        lines.append(f"accuracy (pooled) {s.accuracy:.3f} [{s.ci_low:.2f}, {s.ci_high:.2f}]")
    if s.diff_estimate is not None:
        lines.append(f"vs baseline (pooled) {s.diff_estimate:+.3f} [{s.diff_ci_low:+.3f}, {s.diff_ci_high:+.3f}], "
                     f"Holm p {s.p_adjusted:.3g}")
    if s.mean_kl is not None:
        lines.append(plotly_text(fidelity_text(s)) + f", p99 KL {s.p99_kl:.3g}")
    if s.task_verdicts:
        stopped = s.stopped_by
        verdict = ("acceptable on every task" if s.non_inferior else
                   f"not acceptable: {stopped.task} stopped it ({stopped.criterion})" if stopped is not None else
                   "no task can judge it")
        lines.append(plotly_text(f"{verdict}; decided by {s.decided_by}"))
    lines.append(f"KV {'≈' if s.kv_bytes_estimated else ''}{s.physical_kv_bytes / MIB:.3f} MiB"
                 f" ({'estimated from the server pool' if s.kv_bytes_estimated else 'measured'}),"
                 f" {s.compression_ratio:.2f}x, kept {s.kept_fraction:.0%}")
    return lines


def tradeoff_figure(summaries: Sequence[ConfigSummary], axis: str = "bytes", baseline_name: str = "baseline",
                    title: str = "Memory vs accuracy", metric: str = "accuracy",
                    decision: Decision | None = None) -> go.Figure:
    """A metric with its 95% interval as error bars against physical KV bytes or compression ratio,
    the sweet spot annotated with the rule that chose it.  ``metric`` (a key of ``formatting.Y_METRICS``):
    accuracy, with the Pareto front as a line and the baseline's interval as a band; or the fidelity
    to the baseline (mean KL, lower is better; top-1 agreement), with the rule's margin as a line
    where it is set (the baseline, against itself, has no point there).  ``decision``: the one taken on
    every config where ``summaries`` are only those shown (default: :func:`decide` over ``summaries``);
    its sweet spot is starred only where it is drawn."""
    if axis not in X_TITLES:
        raise ValueError(f"axis {axis!r}: one of {', '.join(X_TITLES)}")
    if metric not in Y_TITLES:
        raise ValueError(f"metric {metric!r}: one of {', '.join(Y_TITLES)}")
    points = _plotted(summaries, axis, metric)
    fig = go.Figure()
    fig.update_layout(title=plotly_text(title), xaxis_title=X_TITLES[axis], yaxis_title=Y_TITLES[metric],
                      **(_LAYOUT | {"height": 560, "margin": _LAYOUT["margin"] | {"b": 140}}))
    if metric == "KL":
        fig.update_yaxes(rangemode="tozero")
    else:
        fig.update_yaxes(range=[-0.05, 1.08])
    if axis == "ratio":
        fig.update_xaxes(ticksuffix="x")
    decision = decision or decide(summaries, baseline_name)
    if metric == "accuracy":
        _accuracy_band(fig, next((s for s in points if s.config_name == baseline_name), None))
    else:
        _fidelity_margin(fig, decision.margins, metric, bool(points))
    fig.add_trace(go.Scatter(
        name="configs", x=[_x(s, axis) for s in points], y=[_y(s, metric) for s in points], mode="markers+text",
        text=[plotly_text(s.config_name) for s in points], textposition="top center",
        error_y=_error_y(points, metric), hovertext=_hover(points), hoverinfo="text",
        marker={"size": 9, "color": "#1f77b4"}))
    front = sorted(pareto_front(points, metric), key=lambda s: _x(s, axis))
    if front:
        fig.add_trace(go.Scatter(
            name="Pareto front", x=[_x(s, axis) for s in front], y=[_y(s, metric) for s in front],
            mode="lines+markers", line={"color": "#d62728", "width": 2}, marker=MARKERS["front"],
            hovertext=_hover(front), hoverinfo="text"))
    sweet = decision.sweet_spot
    words = f"Sweet spot: the {decision.rule}." + (f" {decision.note[0].upper()}{decision.note[1:]}."
                                                     if decision.note else "")
    fig.add_annotation(text="<br>".join(textwrap.wrap(plotly_text(words), 120)), xref="paper", yref="paper", x=0,
                       y=-0.2, yanchor="top", showarrow=False, align="left", font={"size": 10, "color": "#555"})
    if sweet is not None and any(s.config_name == sweet.config_name for s in points):
        fig.add_trace(go.Scatter(name="sweet spot", x=[_x(sweet, axis)], y=[_y(sweet, metric)], mode="markers",
                                 marker=MARKERS["chosen"],
                                 hovertext=_hover([sweet]), hoverinfo="text"))
        fig.add_annotation(x=_x(sweet, axis), y=_y(sweet, metric), ax=40, ay=-45, showarrow=True, arrowhead=2,
                           text=f"sweet spot: {plotly_text(sweet.config_name)} ({sweet.compression_ratio:.2f}x, "
                                f"decided by {plotly_text(sweet.decided_by)})")
    return fig


def _accuracy_band(fig: go.Figure, baseline: ConfigSummary | None) -> None:
    """The baseline's accuracy (dotted) and its 95% interval (a band)."""
    if baseline is not None and _ok(baseline.ci_low):
        fig.add_hrect(y0=baseline.ci_low, y1=baseline.ci_high, fillcolor="#2ca02c", opacity=0.12, line_width=0,
                      annotation_text="baseline 95% CI", annotation_position="bottom left")
        fig.add_hline(y=baseline.accuracy, line_dash="dot", line_color="#2ca02c")


def _fidelity_margin(fig: go.Figure, margins: Margins, metric: str, measured: bool) -> None:
    """The rule's fidelity margin for ``metric`` as a dashed line (where it is set), or why nothing is drawn."""
    if not measured:
        fig.add_annotation(text="fidelity to the baseline is not measured in this experiment (an endpoint backend, "
                                "or results stored before kvlab measured it)", xref="paper", yref="paper", x=0.5,
                           y=0.5, showarrow=False, font={"size": 13, "color": "#555"})
        return
    bound, words = ((margins.max_kl, f"max_kl: {margins.max_kl:g} nats") if metric == "KL" else
                    (margins.min_agreement, f"min_agreement: {margins.min_agreement:.0%}"))
    if bound > 0:
        fig.add_hline(y=bound, line_dash="dash", line_color="#d62728", annotation_text=f"margin ({words})",
                      annotation_position="top left")


def latency_figure(summaries: Sequence[ConfigSummary]) -> go.Figure:
    """Median TTFT and TPOT per config against its compression ratio."""
    points = [s for s in summaries if _ok(s.compression_ratio)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time to first token", "time per output token"))
    for col, attr in ((1, "ttft_s"), (2, "tpot_s")):
        shown = [s for s in points if _ok(getattr(s, attr))]
        fig.add_trace(go.Scatter(
            name="TTFT" if col == 1 else "TPOT", x=[s.compression_ratio for s in shown],
            y=[getattr(s, attr) * 1000 for s in shown], mode="markers+text",
            text=[plotly_text(s.config_name) for s in shown],
            textposition="top center", marker={"size": 9}), row=1, col=col)
        fig.update_xaxes(title_text="compression ratio (x)", ticksuffix="x", row=1, col=col)
    fig.update_yaxes(title_text="TTFT (ms, median)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="TPOT (ms, median)", rangemode="tozero", row=1, col=2)
    fig.update_layout(title="Latency vs compression", showlegend=False, **_LAYOUT)
    return fig


def capacity_figure(rows: Sequence[Mapping[str, Any]], concurrency: int, title: str) -> go.Figure:
    """Sequences of the chosen context that fit per config (the Capacity section's projection rows), with the
    target concurrency as a line; a config that cannot be projected has no bar (the table says why)."""
    shown = [r for r in rows if r["sequences that fit (projected)"] is not None]
    fig = go.Figure(go.Bar(x=[plotly_text(r["config"]) for r in shown],
                           y=[r["sequences that fit (projected)"] for r in shown],
                           text=[f"{r['sequences that fit (projected)']:,.2f}" for r in shown], textposition="outside",
                           marker={"color": ["#2a9d8f" if r["sequences that fit (projected)"] >= concurrency
                                             else "#e76f51" for r in shown]}))
    fig.add_hline(y=concurrency, line_dash="dash", annotation_text=f"{concurrency} at once")
    fig.update_yaxes(title_text="sequences that fit (projection)", rangemode="tozero")
    fig.update_layout(title=title, showlegend=False, **_LAYOUT)
    return fig


def load_curves_figure(levels: Mapping[str, Sequence[LevelResult]]) -> go.Figure:
    """Each config's load curves: output tokens/s against clients (closed loop) and p99 TTFT against the request
    rate (open loop; against clients where the load had no rates)."""
    has_open = any(r.mode == "open" for rows in levels.values() for r in rows)
    right = ("p99 TTFT vs request rate" if has_open else "p99 TTFT vs clients")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("output tokens/s vs clients", right))
    for index, (name, rows) in enumerate(levels.items()):
        color = _PALETTE[index % len(_PALETTE)]
        closed = [r for r in rows if r.mode == "closed"]
        fig.add_trace(go.Scatter(x=[r.level for r in closed], y=[r.output_throughput for r in closed],
                                 mode="lines+markers", name=plotly_text(name), legendgroup=name,
                                 line={"color": color}), row=1, col=1)
        latency = [r for r in rows if r.mode == ("open" if has_open else "closed")]
        fig.add_trace(go.Scatter(x=[r.level for r in latency], y=[r.latency("ttft", "p99") for r in latency],
                                 mode="lines+markers", name=plotly_text(name), legendgroup=name, showlegend=False,
                                 line={"color": color}), row=1, col=2)
    fig.update_xaxes(title_text="clients (closed loop)", row=1, col=1)
    fig.update_xaxes(title_text="requests/s (open loop)" if has_open else "clients (closed loop)", row=1, col=2)
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="p99 TTFT (ms)", rangemode="tozero", row=1, col=2)
    fig.update_layout(title="Under load: throughput and latency per config", **_LAYOUT)
    return fig


def halves_figure(points: Sequence[HalvesPoint], front: Sequence[str], title: str) -> go.Figure:
    """What each config costs (mean KL, 95% interval) against what it buys (output tokens/s at one load level),
    the front over both as a line; configs whose KL was not measured are left out (the page says which)."""
    shown = [p for p in points if p.mean_kl is not None]
    fig = go.Figure(go.Scatter(
        x=[p.mean_kl for p in shown], y=[p.output_throughput for p in shown], mode="markers+text",
        text=[plotly_text(p.config) for p in shown], textposition="top center", marker={"size": 11},
        error_x={"type": "data", "symmetric": False,
                 "array": [(p.kl_high - p.mean_kl) if p.kl_high is not None and p.mean_kl is not None else 0
                           for p in shown],
                 "arrayminus": [(p.mean_kl - p.kl_low) if p.kl_low is not None and p.mean_kl is not None else 0
                                for p in shown]},
        hovertext=[f"{html.escape(p.config)}: {p.output_throughput:.1f} output tokens/s at {p.level}, max running "
                   f"{p.max_running if p.max_running is not None else '-'}" for p in shown],
        hoverinfo="text", name="configs"))
    on_front = [p for name in front for p in shown if p.config == name]
    if len(on_front) > 1:
        fig.add_trace(go.Scatter(x=[p.mean_kl for p in on_front], y=[p.output_throughput for p in on_front],
                                 mode="lines", line={"dash": "dot", "color": "#555"}, name="front (both halves)"))
    level = shown[0].level if shown else ""
    fig.update_xaxes(title_text="mean KL vs baseline (nats/token, lower is better)", rangemode="tozero")
    fig.update_yaxes(title_text=f"output tokens/s at {level}", rangemode="tozero")
    fig.update_layout(title=title, **_LAYOUT)
    return fig


def breakdown_figure(groups: Mapping[Any, Sequence[ConfigSummary]], dimension: str) -> go.Figure:
    """Accuracy per config, grouped by ``dimension`` (``task`` or ``context length``)."""
    labels = [f"{g} tokens" if dimension == "context length" else f"question {g + 1}" if dimension == "question rank"
              else plotly_text(str(g)) for g in groups]
    names = list(dict.fromkeys(s.config_name for summaries in groups.values() for s in summaries))
    fig = go.Figure()
    for name in names:
        rows = [next((s for s in summaries if s.config_name == name), None) for summaries in groups.values()]
        fig.add_trace(go.Bar(
            name=plotly_text(name), x=labels,
            y=[s.accuracy if s is not None and _ok(s.accuracy) else None for s in rows],
            # (an accuracy's interval is set with it: analysis.summarize)
            error_y={"type": "data", "symmetric": False,
                     "array": [cast(float, s.ci_high) - s.accuracy if s is not None and _ok(s.accuracy) else 0
                               for s in rows],
                     "arrayminus": [s.accuracy - cast(float, s.ci_low) if s is not None and _ok(s.accuracy) else 0
                                    for s in rows]}))
    unit = "context length (tokens)" if dimension == "context length" else dimension
    fig.update_layout(title=f"Accuracy by {dimension}", barmode="group", xaxis_title=unit,
                      yaxis_title=ACCURACY_TITLE, **_LAYOUT)
    fig.update_yaxes(range=[0, 1.05])
    return fig


#: Generated tokens pooled into one point of :func:`generation_figure` (traces are thinned per item).
GENERATION_BIN = 8


def has_generation_trace(results: Sequence[ItemResult]) -> bool:
    """Whether any result measured its cache over a generation (the embedded engine's answers)."""
    return any("generation_kv" in (r.extra or {}) for r in results)


def generation_figure(results: Sequence[ItemResult]) -> go.Figure:
    """The measured KV cache (MiB) against tokens generated, per config: the mean over items within bins
    of :data:`GENERATION_BIN` tokens; a config compressing during generation saws down at each cut."""
    points: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        trace = (r.extra or {}).get("generation_kv")
        if trace and r.error is None:
            start = trace["tokens"][0]
            for tokens, size in zip(trace["tokens"], trace["bytes"], strict=True):
                points[r.config_name][(tokens - start) // GENERATION_BIN * GENERATION_BIN].append(size)
    fig = go.Figure()
    for index, (name, bins) in enumerate(points.items()):
        xs = sorted(bins)
        fig.add_trace(go.Scatter(
            name=plotly_text(name), x=xs, y=[statistics.fmean(bins[x]) / 2**20 for x in xs], mode="lines",
            line={"color": _PALETTE[index % len(_PALETTE)]},
            hovertemplate="%{fullData.name}<br>%{x} tokens generated<br>%{y:.2f} MiB<extra></extra>"))
    fig.update_layout(title="KV cache over the generation (measured, mean over items)",
                      xaxis_title="tokens generated (after the prompt's pass)", yaxis_title="KV cache (MiB)",
                      **_LAYOUT)
    fig.update_yaxes(rangemode="tozero")
    return fig


def layout_configs(results: Sequence[ItemResult]) -> list[str]:
    """Configs whose results say where their cache's memory is (the embedded engine's), the baseline last (its
    layout is every token in every head)."""
    names = dict.fromkeys(r.config_name for r in results if "cache_layout" in (r.extra or {}) and r.error is None)
    return sorted(names, key=lambda name: name == BASELINE.label)


def cache_layout_figure(results: Sequence[ItemResult], config_name: str) -> go.Figure:
    """One config's prompt cache right after compression, by layer: the tokens each KV head kept (a heatmap,
    the mean over items) and each layer's measured bytes (MiB, the mean over items)."""
    layouts = [CacheLayout.from_dict(r.extra["cache_layout"]) for r in results
               if r.config_name == config_name and r.error is None and "cache_layout" in (r.extra or {})]
    layers = range(len(layouts[0].kept)) if layouts else range(0)
    heads = range(max((len(k) for k in layouts[0].kept), default=0)) if layouts else range(0)
    kept = [[statistics.fmean(layout.kept[layer][head] for layout in layouts) for layer in layers] for head in heads]
    sizes = [statistics.fmean(layout.bytes[layer] for layout in layouts) / MIB for layer in layers]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.6, 0.4], vertical_spacing=0.08,
                        subplot_titles=("tokens kept per KV head", "measured bytes per layer (MiB)"))
    fig.add_trace(go.Heatmap(z=kept, x=list(layers), y=[f"head {h}" for h in heads], colorscale="Viridis",
                             colorbar={"title": "tokens", "len": 0.55, "y": 0.72},
                             hovertemplate="layer %{x}, %{y}: %{z:.1f} tokens kept<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=list(layers), y=sizes, marker_color=_PALETTE[0], showlegend=False,
                         hovertemplate="layer %{x}: %{y:.3f} MiB<extra></extra>"), row=2, col=1)
    items = f"{len(layouts)} item" + ("s" if len(layouts) != 1 else "")
    fig.update_layout(title=plotly_text(f"{config_name}: where the prompt's cache is ({items})"),
                      **(_LAYOUT | {"height": 560}))
    fig.update_xaxes(title_text="layer", row=2, col=1)
    return fig


def needle_configs(results: Sequence[ItemResult]) -> list[str]:
    """Configs with scored needle items (passkey, multikey) at known depths."""
    return list(dict.fromkeys(r.config_name for r in results if _is_needle(r)))


def _is_needle(result: ItemResult) -> bool:
    task = TASKS.get(result.task)
    return task is not None and task.needle_depths and result.depth is not None and result.score is not None


def needle_heatmap(results: Sequence[ItemResult], config_name: str) -> go.Figure:
    """Mean score per (needle depth, context length) of one config: where in the context it loses the needle."""
    cells: dict[tuple[float, int], list[float]] = defaultdict(list)
    for r in results:
        if r.config_name == config_name and _is_needle(r) and r.depth is not None and r.score is not None:
            cells[(round(r.depth, 3), r.context_length)].append(r.score)
    depths = sorted({d for d, _ in cells})
    lengths = sorted({n for _, n in cells})
    z = [[statistics.fmean(cells[(d, n)]) if cells.get((d, n)) else None for n in lengths] for d in depths]
    text = [[f"{sum(cells[(d, n)]):g}/{len(cells[(d, n)])}" if cells.get((d, n)) else "" for n in lengths]
            for d in depths]
    fig = go.Figure(go.Heatmap(
        x=[str(n) for n in lengths], y=[f"{d:.2f}" for d in depths], z=z, zmin=0, zmax=1, text=text,
        texttemplate="%{text}", colorscale="RdYlGn", colorbar={"title": {"text": "accuracy (0-1)"}},
        hovertemplate="length %{x} tokens<br>depth %{y}<br>accuracy %{z:.2f} (%{text})<extra></extra>"))
    fig.update_layout(title=f"Needle retrieval: {plotly_text(config_name)}", xaxis_title="context length (tokens)",
                      yaxis_title="needle depth (fraction of context)", **_LAYOUT)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def item_kl_figure(results: Sequence[ItemResult], item_id: str) -> go.Figure:
    """One item's KL(baseline || config) at each token it was teacher-forced on, one line per config
    whose fidelity was measured there; a cross marks each config's first divergence (the first token
    whose top-1 differs from the baseline's: where its own greedy output would leave the baseline's)."""
    rows = [(r.config_name, r.fidelity) for r in results if r.item_id == item_id and r.fidelity is not None]
    fig = go.Figure()
    for index, (config_name, fidelity) in enumerate(rows):
        color, name = _PALETTE[index % len(_PALETTE)], plotly_text(config_name)
        # the name through %{fullData.name}, never inside the template, where "%{" in a name would be read
        fig.add_trace(go.Scatter(
            name=name, legendgroup=name, x=list(range(fidelity.tokens)), y=list(fidelity.kl), mode="lines+markers",
            line={"color": color}, marker={"size": 5},
            customdata=["same top-1 token" if same else "another top-1 token" for same in fidelity.agree],
            hovertemplate="%{fullData.name}<br>token %{x}<br>KL %{y:.3g} nats<br>%{customdata}<extra></extra>"))
        at = fidelity.first_divergence
        if at is not None:
            fig.add_trace(go.Scatter(
                name=f"{name}: first divergence", legendgroup=name, showlegend=False, x=[at], y=[fidelity.kl[at]],
                mode="markers", marker={"symbol": "x", "size": 13, "color": color, "line": {"width": 1}},
                hovertemplate="%{fullData.name} at token %{x}<extra></extra>"))
    teacher = rows[0][1].teacher if rows else "the baseline's tokens"
    fig.update_layout(title=f"KL along the tokens of {plotly_text(item_id)}", legend_title_text="config",
                      xaxis_title=f"token position (teacher-forced on {teacher})",
                      yaxis_title="KL(baseline || config) (nats)", **_LAYOUT)
    fig.update_yaxes(rangemode="tozero")
    if not rows:
        fig.add_annotation(text="no config's fidelity was measured on this item", xref="paper", yref="paper", x=0.5,
                           y=0.5, showarrow=False, font={"size": 13, "color": "#555"})
    return fig


def telemetry_figure(samples: Sequence[TelemetrySample]) -> go.Figure:
    """Process RSS and KV-cache bytes over time, each sample coloured by the worker's phase; a grey line
    per worker names its machine (its Ray node) on hover."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("process memory (RSS)", "KV cache in use"))
    t0 = min((s.ts for s in samples), default=0.0)
    by_worker: dict[str, list[TelemetrySample]] = defaultdict(list)
    for sample in samples:
        by_worker[sample.worker_id].append(sample)
    for row, attr in ((1, "rss_bytes"), (2, "kv_bytes")):
        for worker, rows in by_worker.items():
            shown = [s for s in rows if getattr(s, attr) is not None]
            node = plotly_text(node_of(worker))  # one line per worker: on Ray, one per node
            fig.add_trace(go.Scatter(x=[s.ts - t0 for s in shown], y=[getattr(s, attr) / MIB for s in shown],
                                     mode="lines", line={"color": "#bbbbbb", "width": 1}, showlegend=False,
                                     name=node, hovertemplate="%{fullData.name}<br>%{x:.1f} s<br>%{y:.1f} MiB"
                                                              "<extra></extra>"), row=row, col=1)
        for phase, color in PHASE_COLORS.items():
            shown = [s for s in samples if s.phase == phase and getattr(s, attr) is not None]
            if shown:
                fig.add_trace(go.Scatter(
                    name=phase, legendgroup=phase, showlegend=row == 1, x=[s.ts - t0 for s in shown],
                    y=[getattr(s, attr) / MIB for s in shown], mode="markers", marker={"color": color, "size": 6},
                    hovertemplate=f"{phase}<br>%{{x:.1f}} s<br>%{{y:.1f}} MiB<extra></extra>"), row=row, col=1)
    fig.update_yaxes(title_text="RSS (MiB)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="KV (MiB)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="time since first sample (s)", row=2, col=1)
    fig.update_layout(title="Memory over time, by phase", legend_title_text="phase",
                      **(_LAYOUT | {"height": 520}))
    return fig


def has_gpu(samples: Sequence[TelemetrySample]) -> bool:
    return any(s.gpu_utilization is not None or s.gpu_memory_used_bytes is not None for s in samples)


def gpu_figure(samples: Sequence[TelemetrySample]) -> go.Figure:
    """GPU utilization and memory over time (NVML samples)."""
    t0 = min((s.ts for s in samples), default=0.0)
    gpu = [s for s in samples if s.source == "nvml"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("GPU utilization", "GPU memory used"))
    for phase, color in PHASE_COLORS.items():
        shown = [s for s in gpu if s.phase == phase]
        if not shown:
            continue
        util = [s for s in shown if s.gpu_utilization is not None]
        memory = [(s.ts, used) for s in shown if (used := s.gpu_memory_used_bytes) is not None]
        fig.add_trace(go.Scatter(name=phase, legendgroup=phase, x=[s.ts - t0 for s in util],
                                 y=[s.gpu_utilization for s in util], mode="markers",
                                 marker={"color": color, "size": 6}), row=1, col=1)
        fig.add_trace(go.Scatter(name=phase, legendgroup=phase, showlegend=False, x=[ts - t0 for ts, _ in memory],
                                 y=[used / MIB for _, used in memory], mode="markers",
                                 marker={"color": color, "size": 6}), row=2, col=1)
    fig.update_yaxes(title_text="utilization (%)", range=[0, 105], row=1, col=1)
    fig.update_yaxes(title_text="memory (MiB)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="time since first sample (s)", row=2, col=1)
    fig.update_layout(title="GPU over time, by phase", legend_title_text="phase", **(_LAYOUT | {"height": 520}))
    return fig


def compare_figure(curves: Mapping[str, Sequence[ConfigSummary]], axis: str = "bytes") -> go.Figure:
    """Several experiments' tradeoffs overlaid: their configs as points, their Pareto fronts as lines."""
    if axis not in X_TITLES:
        raise ValueError(f"axis {axis!r}: one of {', '.join(X_TITLES)}")
    fig = go.Figure()
    for index, (name, summaries) in enumerate(curves.items()):
        color, label = _PALETTE[index % len(_PALETTE)], plotly_text(name)
        points = _plotted(summaries, axis)
        fig.add_trace(go.Scatter(name=label, legendgroup=label, x=[_x(s, axis) for s in points],
                                 y=[s.accuracy for s in points], mode="markers", error_y=_error_y(points),
                                 marker={"size": 9, "color": color}, hovertext=_hover(points), hoverinfo="text"))
        front = sorted(pareto_front(points), key=lambda s: _x(s, axis))
        if front:
            fig.add_trace(go.Scatter(name=f"{label}: Pareto front", legendgroup=label, x=[_x(s, axis) for s in front],
                                     y=[s.accuracy for s in front], mode="lines",
                                     line={"color": color, "dash": "dash"}, hoverinfo="skip"))
    fig.update_layout(title="Tradeoffs compared", xaxis_title=X_TITLES[axis], yaxis_title=ACCURACY_TITLE, **_LAYOUT)
    fig.update_yaxes(range=[-0.05, 1.08])
    if axis == "ratio":
        fig.update_xaxes(ticksuffix="x")
    return fig


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


def parallel_figure(rows: Sequence[CompareRow]) -> go.Figure:
    """Parallel coordinates over the knobs and outcomes of every selected config."""
    ids = sorted({r.experiment_id for r in rows})
    dimensions = [
        {"label": "experiment", "values": [r.experiment_id for r in rows], "tickvals": ids,
         "ticktext": [f"#{i}" for i in ids]},
        {"label": "KV bits (per element)", "values": [r.quant_bits for r in rows], "range": [0, 16],
         "tickvals": [2, 4, 8, 16]},
        {"label": "evicted (fraction of tokens)", "values": [r.removed_fraction for r in rows], "range": [0, 1]},
        {"label": "ratio achieved (x)", "values": [r.ratio for r in rows]},
        {"label": "accuracy (0-1)", "values": [r.accuracy for r in rows], "range": [0, 1]},
    ]
    fig = go.Figure(go.Parcoords(dimensions=dimensions, line={
        "color": [r.accuracy for r in rows], "colorscale": "Viridis", "cmin": 0, "cmax": 1, "showscale": True,
        "colorbar": {"title": {"text": "accuracy"}}}))
    fig.update_layout(title="Parameters and outcomes", **(_LAYOUT | {"margin": {"l": 80, "r": 80, "t": 90, "b": 40}}))
    return fig
