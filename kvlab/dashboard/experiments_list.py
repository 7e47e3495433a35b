"""The experiments list (pages/list_experiments.py) without Streamlit: its sort choices and page size, and its
table's rows (each one's link, kind, progress, sweet spot, start in the viewer's zone, notes) with their help."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from kvlab.analysis.summary import Decision
from kvlab.core.margins import Margins
from kvlab.dashboard import page_table
from kvlab.dashboard.experiment_status import experiment_duration, kind, progress, trials_text
from kvlab.dashboard.formatting import fmt_duration, fmt_time, is_present
from kvlab.store.records import ExperimentRecord
from kvlab.tune.progress import Budgets

#: Experiments table: sort choice -> ``Store.list_experiments(order=...)``.
SORTS = {"newest": "-created_at", "oldest": "created_at", "name": "name", "status": "status",
         "recently started": "-started_at", "recently finished": "-finished_at"}
PAGE_SIZE = 50


#: The experiments table's "best ratio holding baseline" column, in the words of the decision's own
#: rule (:meth:`kvlab.analysis.decision.Margins.rule`) at the default margins: each experiment is
#: judged at its own (its spec's max_drop, max_kl and min_agreement).
BEST_RATIO_HELP = (f"The {Margins().rule('its')}. Each experiment is judged at its own margins (its spec's "
                   "max_drop, max_kl and min_agreement; these words give the defaults). Compression ratio = "
                   "baseline KV bytes / physical KV bytes.")


def page_link(experiment: ExperimentRecord) -> str:
    """The link to the experiment's own page, relative to the dashboard's: a tune's opens on /tune."""
    page = page_table.TUNE if kind(experiment) == "tune" else page_table.EXPERIMENT
    return f"{page.url_path}?id={experiment.id}"


#: The experiments table's notes: their first line, cut to this many characters.
NOTES_SHOWN = 60


def notes_excerpt(notes: str, limit: int = NOTES_SHOWN) -> str:
    """The first line of ``notes``, cut at ``limit`` characters with ``…`` where anything is left out."""
    first, _, rest = notes.strip().partition("\n")
    return first[:limit] + ("…" if len(first) > limit or rest.strip() else "")


def started_column(zone_name: str) -> str:
    """The experiments table's start column, naming the zone its times are in."""
    return f"started ({zone_name})"


def experiment_rows(experiments: Sequence[ExperimentRecord], decisions: Mapping[int, Decision],
                    zone: tuple[tzinfo, str] = (UTC, "UTC"), now: datetime | None = None,
                    tunes: Mapping[int, Budgets] | None = None) -> list[dict[str, Any]]:
    """Rows of the experiments table: the link to each one's page (``id``), its kind, where it stands (a
    tune's by its ``tunes`` budgets, as its page counts them) and its sweet spot's figures (``decisions``:
    of the experiments with results), times in ``zone`` (its :func:`viewer_zone`)."""
    rows = []
    tunes = tunes or {}
    for e in experiments:
        spot = decisions[e.id].sweet_spot if e.id in decisions else None
        rows.append({
            "id": page_link(e), "kind": kind(e), "name": e.name, "status": e.status,
            "progress": progress(e, tunes.get(e.id)), "trials": trials_text(e, tunes.get(e.id)),
            "items": f"{e.items_done}/{e.items_total or '?'}",
            "sweet spot": (spot.config_name + (f" ({e.partial})" if e.partial else "")) if spot else "-",
            "best ratio held (x)": round(spot.compression_ratio, 2) if spot and is_present(spot.compression_ratio)
            else None,
            "its mean KL (nats)": float(f"{spot.mean_kl:.3g}") if spot and spot.mean_kl is not None else None,
            "model": e.model, started_column(zone[1]): fmt_time(e.started_at, zone[0]),
            "duration": fmt_duration(experiment_duration(e, now)), "tags": ", ".join(e.tags),
            "notes": notes_excerpt(e.notes),
        })
    return rows
