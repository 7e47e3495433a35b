"""Experiment data for reports: CSV of item results, JSON of everything (no secrets are ever stored,
and both pass through :func:`kvlab.secrets.redact` on the way out)."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, fields
from typing import Any

from kvlab.analysis.summary import decide, summarize
from kvlab.core.margins import Margins
from kvlab.core.results import ItemResult
from kvlab.secrets import redact, redact_data
from kvlab.store import ExperimentStore
from kvlab.store.records import baseline_name

RESULT_COLUMNS = [f.name for f in fields(ItemResult)]
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def results_csv(results: list[ItemResult]) -> str:
    """One row per (item, config); nested fields (config, extra) as JSON text; text cells made inert
    for spreadsheets (:func:`spreadsheet_safe`)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_COLUMNS)
    writer.writeheader()
    for result in results:
        row = result.to_dict()
        row["config"], row["extra"] = json.dumps(row["config"], sort_keys=True), json.dumps(row["extra"])
        writer.writerow({key: spreadsheet_safe(value) for key, value in row.items()})
    return redact(buffer.getvalue())


def spreadsheet_safe(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula (it starts with ``= + - @``, a tab or a
    carriage return: a model's output or a task's item id can) gets a leading ``'``, which
    spreadsheets show as text.  Numbers, and text that is just a number such as ``-5``, stay as
    they are (OWASP's CSV injection advice)."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def experiment_document(store: ExperimentStore, experiment_id: int) -> dict[str, Any]:
    """The experiment, its trials, per-config summaries, every item result and its event log."""
    experiment = store.get_experiment(experiment_id)
    trials = store.trials(experiment_id)
    results = store.item_results(experiment_id)
    baseline = baseline_name(trials)
    summaries = summarize(results, baseline, Margins.of(experiment.spec))
    document = {
        "experiment": _jsonable(asdict(experiment)),
        "trials": [_jsonable(asdict(t)) for t in trials],
        "summary": [s.to_dict() for s in summaries],
        "sweet_spot": decide(summaries, baseline).to_dict(),
        "results": [r.to_dict() for r in results],
        "events": [_jsonable(asdict(e)) for e in store.events(experiment_id)],
    }
    tune = store.tune(experiment_id)
    if tune is not None:  # a tune's search: its verdict on each candidate and its recommendation
        document["tune"] = _jsonable(asdict(tune)) | {
            "candidates": [asdict(c) for c in store.candidates(experiment_id)]}
    return redact_data(document)  # a database written by an older kvlab may hold a URL password


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
