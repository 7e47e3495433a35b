"""Pure figure builders of the tune page: a tune's progress (:mod:`kvlab.tune.progress`) -> plotly Figure.

Every axis says its unit; the page, its exports and the CLI's numbers come from the same points.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.core.units import MIB
from kvlab.dashboard.charts import MARKERS, plotly_text
from kvlab.tune.importance import Importance, Metric, Sample, categorical, varying
from kvlab.tune.progress import UNFINISHED, Point

_LAYOUT = {"template": "plotly_white", "margin": {"l": 70, "r": 30, "t": 60, "b": 60}, "height": 480}
#: How each state is drawn (its marker from the charts' vocabulary, :data:`kvlab.dashboard.charts.MARKERS`):
#: complete solid, stopped greyed, active (still running or waiting) open, unfinished (its tune ended first) apart.
STYLES = {
    "complete": {"name": "complete (every item)", "marker": MARKERS["complete"], "opacity": 1.0},
    "active": {"name": "active (more items to come)", "marker": MARKERS["active"], "opacity": 1.0},
    "stopped": {"name": "stopped early", "marker": MARKERS["stopped"], "opacity": 0.55},
    UNFINISHED: {"name": "unfinished (the tune ended first)", "marker": MARKERS["unfinished"], "opacity": 0.8},
}
#: The order the states are drawn in (the last on top).
DRAWN = ("stopped", UNFINISHED, "active", "complete")
FRONT_TITLE = "Pareto front so far: KV bytes vs accuracy"
HYPERVOLUME_TITLE = "Hypervolume over trials"
IMPORTANCE_TITLE = "Parameter importance"
SLICE_TITLE = "Slice plot"


def _drawn(point: Point) -> bool:
    return point.kv_bytes is not None and point.accuracy is not None


def _mib(point: Point) -> float:
    """A drawn point's KV bytes in MiB (:func:`_drawn`; a point of the front is feasible, so measured too)."""
    assert point.kv_bytes is not None
    return point.kv_bytes / MIB


def _hover(point: Point) -> str:
    interval = (f"{point.diff:+.3f} [{point.diff_low:+.3f}, {point.diff_high:+.3f}]"
                if point.diff is not None and point.diff_low is not None and point.diff_high is not None else "-")
    return (f"<b>{plotly_text(point.label)}</b><br>{point.state} on {point.judged_items} items (rung {point.rung})"
            f"<br>accuracy {point.accuracy:.3f}, vs baseline {interval}<br>KV {_mib(point):.3f} MiB"
            + (f"<br>{plotly_text(point.reason)}" if point.reason else ""))


def front_figure(shown: Sequence[Point], front: Sequence[Point], baseline: tuple[float | None, float | None],
                 recommended: str | None = None, title: str = FRONT_TITLE, final: bool = True) -> go.Figure:
    """Every judged candidate at (KV MiB, accuracy) with its paired-difference 95% interval drawn
    around its accuracy (the difference's interval, shifted by the candidate's accuracy minus the
    difference: the baseline's accuracy on the same items); the feasible front as a step line; the
    baseline (a diamond); ``recommended`` starred, as an experiment's sweet spot is (the charts' one marker
    vocabulary): the tune's answer, or its best so far while it runs (``final`` False)."""
    fig = go.Figure()
    for state in DRAWN:
        group = [p for p in shown if p.state == state and _drawn(p)]
        if not group:
            continue
        style = STYLES[state]
        fig.add_trace(go.Scatter(
            x=[_mib(p) for p in group], y=[p.accuracy for p in group], mode="markers", name=style["name"],
            marker=style["marker"], opacity=style["opacity"], hovertext=[_hover(p) for p in group],
            hoverinfo="text",
            error_y={"type": "data", "symmetric": False, "thickness": 1.2,
                     "array": [(p.diff_high - p.diff) if p.diff is not None and p.diff_high is not None else 0
                               for p in group],
                     "arrayminus": [(p.diff - p.diff_low) if p.diff is not None and p.diff_low is not None else 0
                                    for p in group]}))
    if front:
        fig.add_trace(go.Scatter(x=[_mib(p) for p in front], y=[p.accuracy for p in front],
                                 mode="lines", line={"color": "#2ca02c", "width": 2, "shape": "hv"},
                                 name="Pareto front (feasible)", hoverinfo="skip"))
    base_bytes, base_accuracy = baseline
    if base_bytes is not None and base_accuracy is not None:
        fig.add_trace(go.Scatter(x=[base_bytes / MIB], y=[base_accuracy], mode="markers", name="baseline (16-bit)",
                                 marker=MARKERS["baseline"],
                                 hovertext=[f"<b>baseline</b><br>accuracy {base_accuracy:.3f}"
                                            f"<br>KV {base_bytes / MIB:.3f} MiB"], hoverinfo="text"))
    chosen = [p for p in shown if p.label == recommended and _drawn(p)]
    if chosen:
        fig.add_trace(go.Scatter(x=[_mib(chosen[0])], y=[chosen[0].accuracy], mode="markers",
                                 name=f"{'recommended' if final else 'best so far'}: {plotly_text(chosen[0].label)}",
                                 hoverinfo="skip", marker=MARKERS["chosen"]))
    fig.update_layout(title=plotly_text(title), xaxis_title="physical KV cache (MiB per item, measured)",
                      yaxis_title="accuracy (fraction correct; bars: paired 95% interval vs baseline)",
                      legend={"orientation": "h", "y": -0.2}, **_LAYOUT)
    fig.update_yaxes(range=[-0.05, 1.05])
    return fig


def hypervolume_figure(shown: Sequence[Point], history: Sequence[float], title: str = HYPERVOLUME_TITLE) -> go.Figure:
    """The hypervolume after each candidate, in the order the tune proposed them."""
    fig = go.Figure(go.Scatter(
        x=list(range(1, len(history) + 1)), y=list(history), mode="lines+markers", line={"shape": "hv"},
        name="hypervolume",
        hovertext=[f"after {plotly_text(p.label)}: {h:.3f}" for p, h in zip(shown, history, strict=False)],
        hoverinfo="text"))
    fig.update_layout(title=plotly_text(title), xaxis_title="candidates proposed (trial order)",
                      yaxis_title="hypervolume (fraction of baseline bytes x accuracy 1)", showlegend=False, **_LAYOUT)
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(rangemode="tozero")
    return fig


def importance_figure(result: Importance, metric: Metric, title: str = IMPORTANCE_TITLE) -> go.Figure:
    """Each parameter's share of the importance for ``metric`` (Optuna's PED-ANOVA), the most important on top."""
    ranked = sorted(result.values.items(), key=lambda item: item[1])
    fig = go.Figure(go.Bar(x=[value for _, value in ranked], y=[name for name, _ in ranked], orientation="h",
                           marker={"color": "#1f77b4"}, text=[f"{value:.2f}" for _, value in ranked],
                           textposition="auto", hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_layout(title=plotly_text(f"{title}: {metric.label}"),
                      xaxis_title=f"importance (PED-ANOVA, best {result.quantile:.0%} of {result.candidates} "
                                  "candidates vs all; shares sum to 1)",
                      yaxis_title="parameter", showlegend=False,
                      **(_LAYOUT | {"height": max(260, 120 + 40 * len(ranked))}))
    fig.update_xaxes(range=[0, 1])
    return fig


def slice_figure(found: Sequence[Sample], metric: Metric, title: str = SLICE_TITLE) -> go.Figure:
    """A slice plot, as Optuna draws one (``optuna.visualization.plot_slice``: ``metric`` against each
    parameter that varies, one panel each, one point per candidate), drawn here so that each point
    says which candidate it is and how far it got: coloured by state like the front, hover naming
    the candidate and its Optuna trial number (Optuna's own colours trials by number and names none)."""
    names = varying(found)
    fig = make_subplots(rows=1, cols=max(1, len(names)), shared_yaxes=True, horizontal_spacing=0.04)
    legend: set[str] = set()
    for column, name in enumerate(names, start=1):
        having = [s for s in found if name in s.params]
        for state in DRAWN:
            group = [s for s in having if s.state == state]
            if not group:
                continue
            style = STYLES[state]
            fig.add_trace(go.Scatter(
                x=[str(s.params[name]) if categorical(s, name) else s.params[name] for s in group],
                y=[s.value for s in group], mode="markers", name=style["name"], legendgroup=state,
                showlegend=state not in legend, marker=style["marker"], opacity=style["opacity"], hoverinfo="text",
                hovertext=[f"<b>{plotly_text(s.label)}</b> (trial {s.number})<br>{name} = "
                           f"{plotly_text(str(s.params[name]))}<br>{metric.label}: {s.value:.4g}"
                           f"<br>{s.state} on {s.judged_items} items" for s in group]), row=1, col=column)
            legend.add(state)
        if having and categorical(having[0], name):
            seen = {str(s.params[name]) for s in having}
            choices = getattr(having[0].distributions[name], "choices", ())
            fig.update_xaxes(type="category", categoryorder="array", row=1, col=column,
                             categoryarray=[c for c in map(str, choices) if c in seen])
        fig.update_xaxes(title_text=name, row=1, col=column)
    fig.update_yaxes(title_text=metric.label, row=1, col=1)
    fig.update_layout(title=plotly_text(f"{title}: {metric.label}"), legend={"orientation": "h", "y": -0.25},
                      **_LAYOUT)
    return fig
