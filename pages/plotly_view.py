"""Draw plotly figures in the page with plotly.js' cartesian bundle, not ``st.plotly_chart``'s full one.

Every new tab (a new session) evaluates the plotly.js it draws with.  ``st.plotly_chart`` ships the
full bundle (4.7 MB: maps, 3D, WebGL traces), whose evaluation and the chart's drawing took ~1.2 s of
each chart page's load on 2 CPU cores; the cartesian bundle (1.5 MB: scatter, bar, heatmap, box, pie,
...) takes about half.  It is vendored in ``static/`` (MIT; its version is the one plotly.py bundles, so
the figures' JSON is the same) and served by Streamlit's static serving (``server.enableStaticServing``),
so the browser's HTTP cache and V8's code cache keep it across tabs.  A figure with a trace the bundle
lacks (the compare page's parallel coordinates) is drawn by ``st.plotly_chart``.
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

PLOTLY_JS_VERSION = "4.1.1"
BUNDLE = f"plotly-cartesian-{PLOTLY_JS_VERSION}.min.js"
#: The trace types the cartesian bundle draws (its README).
TRACE_TYPES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
                         "image", "pie", "scatter", "scatterternary", "violin"})

# One script element per page loads the bundle; each chart waits for it, then draws (Plotly.react
# updates a chart in place when a rerun sends a new figure).  The URL is relative to the page, so it
# also works under a server.baseUrlPath.
_JS = """
export default function ({ parentElement, data }) {
  const plotly = (window.__kvlabPlotly ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = data.bundle;
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => { window.__kvlabPlotly = undefined; reject(new Error("cannot load " + data.bundle)); };
    document.head.appendChild(script);
  }));
  let box = parentElement.querySelector(".kvlab-plot");
  if (!box) {
    box = document.createElement("div");
    box.className = "kvlab-plot";
    parentElement.appendChild(box);
  }
  const figure = JSON.parse(data.figure);
  plotly
    .then((Plotly) => Plotly.react(box, figure.data, figure.layout, { displaylogo: false, responsive: true }))
    .catch((error) => { box.textContent = "The chart could not be drawn: " + error.message; });
}
"""

_component = st.components.v2.component("kvlab_plotly", js=_JS, isolate_styles=False)


def drawable(fig: go.Figure) -> bool:
    """Whether the cartesian bundle draws every trace of ``fig``."""
    return all(trace.type in TRACE_TYPES for trace in fig.data)


def plotly_figure(fig: go.Figure, key: str) -> None:
    """``fig`` in the page, the full width of its container."""
    if not drawable(fig):
        st.plotly_chart(fig, key=key, width="stretch")
        return
    _component(data={"figure": fig.to_json(), "bundle": f"app/static/{BUNDLE}"}, key=key, width="stretch")
