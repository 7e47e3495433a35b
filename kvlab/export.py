"""Experiment data for reports: CSV of item results, JSON of everything (no secrets are ever stored)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from typing import Any

from kvlab.analysis import summarize
from kvlab.results import ItemResult
from kvlab.store import Store

RESULT_COLUMNS = [f.name for f in fields(ItemResult)]


def results_csv(results: list[ItemResult]) -> str:
    """One row per (item, config); nested fields (config, extra) as JSON text."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_COLUMNS)
    writer.writeheader()
    for result in results:
        row = result.to_dict()
        row["config"], row["extra"] = json.dumps(row["config"], sort_keys=True), json.dumps(row["extra"])
        writer.writerow(row)
    return buffer.getvalue()


def experiment_document(store: Store, experiment_id: int) -> dict[str, Any]:
    """The experiment, its trials, per-config summaries, every item result and its event log."""
    experiment = store.get_experiment(experiment_id)
    trials = store.trials(experiment_id)
    results = store.item_results(experiment_id)
    baseline = next((t.config_name for t in trials if t.position == 0), "baseline")
    return {
        "experiment": _jsonable(asdict(experiment)),
        "trials": [_jsonable(asdict(t)) for t in trials],
        "summary": [s.to_dict() for s in summarize(results, baseline)],
        "results": [r.to_dict() for r in results],
        "events": [_jsonable(asdict(e)) for e in store.events(experiment_id)],
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
