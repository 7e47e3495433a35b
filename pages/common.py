"""Streamlit plumbing the pages share: the store, cached reads, charts with their exports, share links.

Not a page (kvlab.dashboard.page_table lists them); everything that computes lives in kvlab/.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import tzinfo
from typing import Any, NamedTuple

import plotly.graph_objects as go
import streamlit as st

from kvlab.analysis.summary import ConfigSummary, Decision, decide, summarize
from kvlab.core.errors import ConfigError
from kvlab.core.margins import Margins
from kvlab.core.results import ItemResult
from kvlab.dashboard import formatting
from kvlab.dashboard.chart_export import (
    IMAGE_FORMATS,
    ExportError,
    figure_html,
    figure_image,
    warm_up,
    with_caveat,
)
from kvlab.dashboard.page_table import DashboardPage
from kvlab.errlog import debug_enabled, log_details, one_line
from kvlab.secrets import redact
from kvlab.store import ExperimentNotFoundError, ExperimentRecord, ExperimentStore, Store, StoreError
from kvlab.store.records import baseline_name
from pages.plotly_view import plotly_figure

#: Errors whose message tells the user what to fix: shown as they are.
USER_ERRORS = (StoreError, ConfigError, ExportError)


@contextmanager
def guard(where: str) -> Iterator[None]:
    """Show an error raised inside as one line on the page, never a traceback.

    Errors that tell the user what to fix (``USER_ERRORS``) are shown as they are; anything else
    is a bug: one line with its type, the traceback appended to the dashboard's log
    (:mod:`kvlab.errlog`), whose path the message gives.  ``KVLAB_DEBUG=1`` re-raises instead, to
    Streamlit, which logs the traceback and shows it with ``--client.showErrorDetails=full``.
    Streamlit's own control flow (``st.stop``, ``st.rerun``) is not an ``Exception`` and passes.
    """
    try:
        yield
    except Exception as error:
        if debug_enabled():
            raise
        if isinstance(error, USER_ERRORS):
            st.error(one_line(redact(str(error)), limit=1000))
            return
        path = log_details("dashboard", f"page {where}", error)
        st.error(f"Something went wrong on this page ({type(error).__name__}: {one_line(redact(str(error)), 160)}). "
                 f"The details are in {path}.")


@st.cache_resource(show_spinner=False)
def _open_store(url: str | None) -> Store:
    return Store(url)


def db_url() -> str | None:
    return os.environ.get("KVLAB_DATABASE_URL")


def get_store() -> Store:
    """The store of ``$KVLAB_DATABASE_URL`` (else db/kvlab.sqlite), opened once per process."""
    try:
        return _open_store(db_url())
    except StoreError as error:
        st.error(f"The experiment store cannot be opened: {error}")
        st.stop()


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def load_results(experiment_id: int, version: tuple[Any, ...], db: str | None) -> tuple[list[ItemResult], str]:
    """An experiment's item results and its baseline's name.  ``version`` (items done, status) and
    ``db`` only key the cache: a result set changes only when they do."""
    store = get_store()
    trials = store.trials(experiment_id)
    baseline = baseline_name(trials)
    return store.item_results(experiment_id), baseline


class View(NamedTuple):
    """What an experiment's analysis depends on: its last update and the viewer's choices.  A tuple of
    plain values (the margins a frozen dataclass of floats), so that ``st.cache_data`` keys on it."""

    experiment_id: int
    version: tuple[Any, ...]  # items done, status: a result set changes only when they do
    db: str | None
    hidden: tuple[str, ...] = ()
    margins: Margins = Margins()


def view_of(experiment: ExperimentRecord, hidden: Sequence[str] = (), max_drop: float | None = None) -> View:
    """The view at the experiment's own margins (its spec's), with ``max_drop`` the viewer's where given."""
    margins = Margins.of(experiment.spec)
    if max_drop is not None:
        margins = dataclasses.replace(margins, max_drop=float(max_drop))
    return View(experiment.id, (experiment.items_done, experiment.status), db_url(), tuple(hidden), margins)


def results_of(experiment: ExperimentRecord) -> tuple[list[ItemResult], str]:
    view = view_of(experiment)
    return load_results(view.experiment_id, view.version, view.db)


def shown_results(view: View) -> tuple[list[ItemResult], str]:
    """The results of the configs not hidden, and the baseline's name."""
    results, baseline = load_results(view.experiment_id, view.version, view.db)
    return [r for r in results if r.config_name not in view.hidden], baseline


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def analysed(view: View) -> tuple[list[ConfigSummary], Decision]:
    """The summaries of the configs shown and the sweet-spot decision, computed once per view.  The
    decision is taken on every config: hiding one hides it from the charts and tables, never from the
    Holm family (the number of configs compared) or the verdict, so a display choice cannot change it."""
    results, baseline = load_results(view.experiment_id, view.version, view.db)
    summaries = summarize(results, baseline, view.margins)
    return [s for s in summaries if s.config_name not in view.hidden], decide(summaries, baseline)


def summaries_of(experiment: ExperimentRecord) -> tuple[list[ConfigSummary], str]:
    return analysed(view_of(experiment))[0], results_of(experiment)[1]


def decision_of(experiment: ExperimentRecord) -> Decision | None:
    """The sweet-spot decision of an experiment with results at its own margins (None without results)."""
    if not experiment.items_done:
        return None
    return analysed(view_of(experiment))[1]


def viewer_zone() -> tuple[tzinfo, str]:
    """The viewer's time zone as their browser reports it (``st.context.timezone``), else UTC; and its name."""
    return formatting.viewer_zone(st.context.timezone)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "kvlab"


#: Seconds between the first chart page's run and the export renderer's start: the browser draws that
#: page meanwhile, rather than share 2 CPU cores with the renderer's Chromium starting (docs/decisions.md).
EXPORT_WARM_UP_DELAY_S = 5.0


@st.cache_resource(show_spinner=False)
def _export_renderer() -> threading.Thread:
    """The image-export renderer, started once per server process by the first page with a chart."""
    return warm_up(EXPORT_WARM_UP_DELAY_S)


def chart(fig: go.Figure, key: str, file_stem: str, caveat: str | None = None) -> None:
    """The figure, and under it downloads as PNG / SVG / PDF / HTML, rendered only when clicked; each
    download carries ``caveat`` (what the page says beside the chart: :func:`with_caveat`)."""
    _export_renderer()
    plotly_figure(fig, key)
    exported = with_caveat(fig, caveat)
    with st.container(horizontal=True):
        for fmt, mime in IMAGE_FORMATS.items():
            st.download_button(fmt.upper(), data=_image_callable(exported, fmt), file_name=f"{file_stem}.{fmt}",
                               mime=mime, key=f"{key}-{fmt}", on_click="ignore", icon=":material/download:")
        st.download_button("HTML", data=lambda: figure_html(exported), file_name=f"{file_stem}.html",
                           mime="text/html", key=f"{key}-html", on_click="ignore", icon=":material/download:")


def _image_callable(fig: go.Figure, fmt: str) -> Callable[[], bytes]:
    return lambda: figure_image(fig, fmt)


def share_box(params: Mapping[str, str | int | Sequence[str | int] | None]) -> None:
    """The link to this view (page and its state), in the sidebar, to select and copy.  Inline code,
    not ``st.code``: its syntax highlighter is a 1.5 MB script that every new tab would evaluate (~0.5 s
    of a page's load on 2 CPU cores, docs/decisions.md)."""
    url = formatting.share_url(st.context.url, params)
    with st.sidebar, st.container(key="share-link"):
        st.caption("Share this view (copy the link):")
        st.markdown(formatting.code_span(url))


def address_bar(params: Mapping[str, str | int | Sequence[str | int] | None]) -> None:
    """Make the browser's address bar the view's link (the parameters :func:`share_box` shows): one state, one
    writer.  For a page whose widgets do not bind themselves to the URL (``bind="query-params"``): Streamlit
    drops a bound widget's parameter from the address bar in every run that does not draw the widget, so a
    section that hides the chart's axes lost ``y`` there while the share link kept it."""
    wanted = formatting.query_values(params)
    if {key: st.query_params.get_all(key) for key in st.query_params} != wanted:
        st.query_params.from_dict(wanted)


def empty_state(message: str, page: DashboardPage | None = None, label: str | None = None) -> None:
    """Say what to do, with a link to the page where it is done."""
    st.info(message, icon=":material/info:")
    if page is not None:
        st.page_link(page.script, label=label or page.url_path, icon=":material/arrow_forward:")


#: What cancelling an experiment does, said in the question asked before it is done.
CANCEL_CONSEQUENCE = "Their queued and running trials stop; results already stored are kept."


def cancel_experiment(store: ExperimentStore, experiment_id: int) -> tuple[str, str]:
    """Cancel the experiment's queued and running trials (its workers learn it at their next heartbeat): the
    message to show, ``("ok", text)``, or ``("error", text)`` where the store refused."""
    try:
        count = store.cancel_experiment(experiment_id)
    except StoreError as error:
        return "error", str(error)
    return "ok", f"Experiment {experiment_id}: {count} trial(s) cancelled."


def experiment_label(experiment: ExperimentRecord) -> str:
    return f"#{experiment.id} {experiment.name} ({experiment.status})"


def pick_experiment(store: ExperimentStore, candidates: Sequence[ExperimentRecord], what: str,
                    key: str) -> ExperimentRecord:
    """The experiment the URL's ``id`` names (else the newest of ``candidates``), with a selector to
    switch that keeps ``id`` in the URL; a link to a missing one says so and stops the page."""
    raw = st.query_params.get("id")
    wanted = formatting.parse_int(raw)
    if wanted is None and raw is not None:
        st.warning(f"The link's id {formatting.md(repr(raw[:40]))} is not an experiment id (a whole number from 1): "
                   f"showing the newest {what} instead.")
    labels = {e.id: f"#{e.id} {e.name}" for e in candidates}  # no status: the live panels show the current one
    if wanted is not None and wanted not in labels:
        labels = {wanted: f"#{wanted}"} | labels
    experiment_id = st.selectbox(what.capitalize(), list(labels), format_func=labels.__getitem__,
                                 index=list(labels).index(wanted) if wanted in labels else 0, key=key)
    if st.query_params.get("id") != str(experiment_id):
        st.query_params["id"] = str(experiment_id)
    try:
        return store.get_experiment(experiment_id)
    except ExperimentNotFoundError as error:
        st.error(f"{error}. Pick another {what} above.")
        st.stop()
        raise  # st.stop() ends the script; this line only tells type checkers so

