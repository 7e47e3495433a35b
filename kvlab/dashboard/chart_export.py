"""Export figures (PNG, SVG, PDF through kaleido; self-contained HTML) and an experiment's HTML report.

kaleido 1.x renders in a headless Chromium that it drives over the DevTools protocol.  It never
downloads one here: :func:`browser_path` finds the system's (Debian's ``chromium``), and one
render server is started per process, by :func:`warm_up` when a page with charts opens or else on
first use (~1 s a figure after that; starting a browser per figure would cost seconds each).
Nothing it exports holds a secret: specs name the environment variable of an API key, never the
key, and URLs lose their user:password part.
"""

from __future__ import annotations

import html
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from kvlab.dashboard.process_exit import stop_at_exit
from kvlab.secrets import redact_data

IMAGE_FORMATS = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf"}
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_lock = threading.Lock()
_log = logging.getLogger(__name__)
_server_started = False


class ExportError(RuntimeError):
    """An image could not be rendered; the message says what to install or change."""


def browser_path() -> str | None:
    """``$KVLAB_CHROMIUM``, else ``$BROWSER_PATH`` (choreographer's own override), else one on PATH."""
    for variable in ("KVLAB_CHROMIUM", "BROWSER_PATH"):
        if os.environ.get(variable):
            return os.environ[variable]
    return next((found for name in BROWSER_NAMES if (found := shutil.which(name))), None)


def _ensure_server() -> None:
    global _server_started
    if _server_started:
        return
    import kaleido

    path = browser_path()
    if path is None:
        raise ExportError("image export needs Chromium: `apt-get install chromium` (or set KVLAB_CHROMIUM)")
    # mathjax=False: kaleido would otherwise fetch MathJax from a CDN for every page it opens.
    kaleido.start_sync_server(path=path, mathjax=False, silence_warnings=True)
    stop_at_exit(_stop_server)
    _server_started = True


def warm_up(delay_s: float = 0.0) -> threading.Thread:
    """Start the render server and render a blank figure in the background, so that the first export
    takes as long as the later ones (starting the browser and loading plotly.js into it take ~10 s
    on 2 CPU cores).  ``delay_s`` first leaves the CPU to what asked for it: the dashboard's first
    page load, which the renderer's start would otherwise slow down.  A failure is logged here; the
    export that meets it says what to install."""
    thread = threading.Thread(target=_warm, args=(delay_s,), name="kvlab-export-warm-up", daemon=True)
    thread.start()
    return thread


def _warm(delay_s: float) -> None:
    time.sleep(delay_s)
    try:
        figure_image(go.Figure(), "png", width=10, height=10)
    except ExportError as error:
        _log.warning("export renderer not started: %s", error)


def _stop_server() -> None:
    """Close kaleido's browser at exit, but never hang the exit: its close joins a thread that waits on
    the browser, forever if the browser was killed first (as a process group's SIGTERM may do)."""
    import kaleido

    closer = threading.Thread(target=kaleido.stop_sync_server, kwargs={"silence_warnings": True}, daemon=True)
    closer.start()
    closer.join(timeout=5)


def figure_image(fig: go.Figure, fmt: str, width: int = 1000, height: int | None = None) -> bytes:
    """The figure as PNG (2x scale), SVG or PDF bytes."""
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(IMAGE_FORMATS)}")
    import kaleido

    opts = {"format": fmt, "width": width, "height": height or fig.layout.height or 500,
            "scale": 2 if fmt == "png" else 1}
    with _lock:
        _ensure_server()
        try:
            return kaleido.calc_fig_sync(fig, opts=opts)
        except Exception as error:  # kaleido raises several types from the browser side
            raise ExportError(f"could not render the chart as {fmt.upper()}: {error}") from error


#: Characters per line of a caveat under an exported chart (at the exports' 1000 px width).
CAVEAT_LINE = 110


def with_caveat(fig: go.Figure, caveat: str | None) -> go.Figure:
    """``fig`` as exported: with ``caveat`` (what the page shows beside the chart, say that its sweet spot rests
    on few items) written under the plot, so that a PNG, SVG, PDF or HTML copy says what the page says.  The
    figure itself is left as it was (a copy is returned; ``fig`` where there is no caveat)."""
    if not caveat:
        return fig
    import textwrap

    lines = textwrap.wrap(caveat, CAVEAT_LINE)
    exported = go.Figure(fig)
    bottom = (exported.layout.margin.b or 80) + 18 * len(lines)
    exported.update_layout(margin={"b": bottom}, height=(fig.layout.height or 500) + 18 * len(lines))
    exported.add_annotation(text="<br>".join(html.escape(line) for line in lines), xref="paper", yref="paper",
                            x=0, y=0, yshift=-bottom + 4, xanchor="left", yanchor="bottom", showarrow=False,
                            align="left", font={"size": 12, "color": "#8a6d00"})
    return exported


def figure_html(fig: go.Figure) -> str:
    """A standalone page with plotly.js inlined: opens offline, anywhere."""
    return fig.to_html(include_plotlyjs=True, full_html=True)


def redact(value: Any) -> Any:
    """Drop credentials from URLs (``scheme://user:pass@host`` -> ``scheme://***@host``) and mask
    known secret values in nested data (:func:`kvlab.secrets.redact_data`)."""
    return redact_data(value)


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    headers = list(rows[0])
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(row.get(h, '')))}</td>" for h in headers) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1rem 0}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
th{background:#f4f4f4}pre{background:#f7f7f7;padding:1rem;overflow:auto}.meta{color:#555}"""


def report_html(title: str, meta: Mapping[str, Any], tables: Mapping[str, Sequence[Mapping[str, Any]]],
                figures: Mapping[str, go.Figure], spec_toml: str, environment: Mapping[str, Any]) -> str:
    """One self-contained HTML file: metadata, tables, interactive charts (plotly.js inlined once),
    the spec and the environment it ran in."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             "<p class='meta'>" + " &middot; ".join(f"{html.escape(str(k))}: {html.escape(str(v))}"
                                                    for k, v in redact(dict(meta)).items()) + "</p>"]
    for heading, rows in tables.items():
        parts += [f"<h2>{html.escape(heading)}</h2>", _table(redact(list(rows)))]
    for heading, fig in figures.items():
        parts += [f"<h2>{html.escape(heading)}</h2>", fig.to_html(include_plotlyjs=False, full_html=False)]
    parts += ["<h2>Spec</h2>", f"<pre>{html.escape(redact(spec_toml))}</pre>",
              "<h2>Environment</h2>", f"<pre>{html.escape(json.dumps(redact(dict(environment)), indent=1))}</pre>",
              f"<p class='meta'>generated by kvlab on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC</p></body></html>"]
    return "".join(parts)
