"""The compare page (pages/compare_experiments.py) without Streamlit: its sections, the experiment ids and trial
keys its URL carries, its cross-engine tables and the rows of its parallel coordinates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.analysis.agreement import EngineAgreement, EngineConfig
from kvlab.analysis.summary import ConfigSummary, stored_config
from kvlab.core.formats import FORMATS
from kvlab.dashboard.formatting import is_missing, is_present, parse_int

#: The compare page's sections: the overlaid tradeoffs (the default), the knobs and outcomes (parallel
#: coordinates and their table).
COMPARE_SECTIONS = ("Tradeoffs", "Parameters", "Engines")


def invalid_ids(values: Iterable[str]) -> list[str]:
    """The parts of id params (see :func:`parse_ids`) that are not ids, to tell the user."""
    return [part.strip() for value in values for part in str(value).split(",")
            if part.strip() and parse_int(part) is None]


def parse_ids(values: Iterable[str]) -> list[int]:
    """Experiment ids from repeated (``ids=1&ids=2``) or comma-separated (``ids=1,2``) params,
    in order, without duplicates; anything else is ignored."""
    ids: list[int] = []
    for value in values:
        for part in str(value).split(","):
            number = parse_int(part)
            if number is not None and number not in ids:
                ids.append(number)
    return ids


def trial_key(experiment_id: int, config_name: str) -> str:
    """How a trial (a config of an experiment) is named in the URL and the pickers: ``3/int4``."""
    return f"{experiment_id}/{config_name}"


@dataclass(frozen=True)
class CompareRow:
    """One config of one experiment, flattened for the parallel-coordinates view."""

    experiment_id: int
    config_name: str
    quant_bits: float
    removed_fraction: float
    accuracy: float
    ratio: float


QUANT_BITS = {name: f.bits_per_value for name, f in FORMATS.items()}


def engine_rows(rows: Sequence[EngineAgreement], a: str, b: str) -> list[dict[str, Any]]:
    """The cross-engine table of two experiments (``a`` and ``b`` name them), as the page shows it."""
    def per_token(value: float | None, estimated: bool) -> str:
        return "-" if value is None else ("≈" if estimated else "") + f"{value:,.0f}"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    return [{"config": row.config_name, "items": row.items,
             f"accuracy {a}": None if row.accuracy_a is None else round(row.accuracy_a, 3),
             f"accuracy {b}": None if row.accuracy_b is None else round(row.accuracy_b, 3),
             "same outcome": share(row.same_outcome), "same text": share(row.same_text),
             f"KV B/token {a}": per_token(row.kv_bytes_a, row.estimated_a),
             f"KV B/token {b}": per_token(row.kv_bytes_b, row.estimated_b),
             f"mean KL {a} [95% CI]": row.fidelity_a.text if row.fidelity_a else "-",
             f"mean KL {b} [95% CI]": row.fidelity_b.text if row.fidelity_b else "-"} for row in rows]


def engines_table_rows(rows: Sequence[EngineConfig]) -> list[dict[str, Any]]:
    """Every engine's configs on the items all compared experiments ran (``kvlab compare A B C``), as the page
    shows them."""
    return [{"experiment": f"#{row.experiment_id}", "engine": row.engine, "config": row.config_name,
             "items": row.items, "accuracy": None if row.accuracy is None else round(row.accuracy, 3),
             "KV B/token": "-" if row.kv_bytes is None else ("≈" if row.estimated else "") + f"{row.kv_bytes:,.0f}",
             "mean KL [95% CI]": row.fidelity.text if row.fidelity else "-",
             "agreement": f"{row.fidelity.agreement:.1%}" if row.fidelity else "-",
             "estimator": row.fidelity.teacher if row.fidelity else "-"} for row in rows]


def compare_rows(summaries_by_experiment: Mapping[int, Sequence[ConfigSummary]],
                 selected: Sequence[str] | None = None) -> list[CompareRow]:
    """Rows of the configs in ``selected`` (trial keys; None: all) that have an accuracy."""
    rows = []
    for experiment_id, summaries in summaries_by_experiment.items():
        for s in summaries:
            if selected is not None and trial_key(experiment_id, s.config_name) not in selected:
                continue
            if not is_present(s.accuracy) or is_missing(s.compression_ratio):
                continue
            parsed = stored_config(s.config)
            removed = parsed.removed_fraction if parsed is not None else None
            if removed is None:  # no eviction, or a threshold: what was actually dropped
                removed = 1.0 - (s.kept_fraction if not is_missing(s.kept_fraction) else 1.0)
            rows.append(CompareRow(experiment_id, s.config_name, QUANT_BITS.get(s.config.get("quant", "none"), 16.0),
                                   float(removed), float(s.accuracy), float(s.compression_ratio)))
    return rows
