"""A hash of a run's per-item results that ignores what varies between runs of the same spec.

Refactors must not change what a spec measures: run the same spec before and after
(`kvlab run examples/quick.toml --limit 2 --json out.json`) and compare
`python scripts/results_hash.py out.json`. Timings, memory peaks of the process and the
store's bookkeeping are left out; floats are rounded to 6 significant digits.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

VARYING_KEYS = {"peak_memory_bytes"}


def _stable(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {
            key: _stable(inner)
            for key, inner in sorted(value.items())
            if not key.endswith("_s") and key not in VARYING_KEYS
        }
    if isinstance(value, list):
        return [_stable(inner) for inner in value]
    return value


def results_hash(run: dict[str, Any]) -> str:
    items = [_stable(result) for result in run["results"]]
    items.sort(key=lambda result: (result["config_name"], result["item_id"]))
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(results_hash(json.load(handle)))
