"""Head-wise budgets, K/V formats, 16-bit layers and KVzip through `kvlab run` and `kvlab tune` as a user runs
them (real processes on the real model, through the store): every config runs, its measured bytes are its
layout's, and a tune proposes them as dimensions of its space."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import TuneSpec
from kvlab.store import Store
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

TASK = """
name = "{name}"
model = "smollm2-135m"
max_drop = 0.5

[[tasks]]
name = "passkey"
context_lengths = [512]
depths = [0.3, 0.7]
num_items = 2
"""

CONFIGS = """
[[configs]]
evict = "snapkv"
ratio = 0.75
heads = "adakv"

[[configs]]
evict = "snapkv"
keep_tokens = 128
heads = "critical_adakv"
alpha_safeguard = 0.5

[[configs]]
evict = "kvzip"
ratio = 0.75

[[configs]]
quant = "int8"
value_quant = "int4"

[[configs]]
quant = "int4"
evict = "knorm"
ratio = 0.5
skip_layers = { first = 1, last = 1 }
"""

TUNE = """
[tune]
quant = ["none", "int4"]
value_quant = ["int8"]
evict = ["none", "knorm", "kvzip"]
heads = ["uniform", "adakv"]
min_items = 2
candidates_per_round = 3
max_trials = 3
"""


def kvlab(tmp_path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}",
           "KVLAB_LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", *args], env=env, capture_output=True, text=True,
                          timeout=SAFETY_S)
    return done.returncode, done.stdout, done.stderr


def test_kvlab_run_stores_each_new_config_with_the_bytes_of_its_layout(tmp_path):
    spec = tmp_path / "bits.toml"
    spec.write_text(TASK.format(name="bits") + CONFIGS)
    status, printed, err = kvlab(tmp_path, "run", str(spec), "--json", str(tmp_path / "out.json"))
    assert status == 0, err
    assert "Traceback" not in err
    labels = ["baseline", "snapkv:r0.75/ada", "snapkv:n128/cada0.5", "kvzip:r0.75", "k:int8/v:int4/g64/r64",
              "int4/g64/r64/16b:f1l1+knorm:r0.5"]
    summary = {s["config_name"]: s for s in json.loads((tmp_path / "out.json").read_text())["summary"]}
    assert list(summary) == labels
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        results = store.item_results(1)
    assert len(results) == 2 * len(labels) and all(r.error is None for r in results)
    baseline = summary["baseline"]["physical_kv_bytes"]
    for result in results:
        layout = result.extra["cache_layout"]
        assert sum(layout["bytes"]) == result.physical_kv_bytes == result.analytic_kv_bytes
        config = KVCacheConfig(**result.config)
        if config.heads != "uniform" or config.evict == "kvzip":  # heads keep different counts
            assert any(len(set(heads)) > 1 for heads in layout["kept"]), result.config_name
    # the same 25% of the context, however it is shared out; KVzip's too
    for name in ("snapkv:r0.75/ada", "kvzip:r0.75"):
        assert summary[name]["physical_kv_bytes"] == pytest.approx(baseline / 4, rel=0.01)
    # 16-bit first and last layers hold more than int4 would alone: the report says so
    assert "int4/g64/r64/16b:f1l1+knorm:r0.5" in printed.split("freeing less memory")[1]


def test_kvlab_tune_searches_head_budgets_value_formats_and_kvzip(tmp_path):
    spec = tmp_path / "tune.toml"
    spec.write_text(TASK.format(name="bits-tune") + TUNE)
    status, printed, err = kvlab(tmp_path, "tune", str(spec))
    assert status == 0, err
    assert "Traceback" not in err
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        trials = store.trials(1)
        results = store.item_results(1)
    proposed = [KVCacheConfig(**t.config) for t in trials if t.config_name != "baseline"]
    assert len(proposed) == 3 and all(r.error is None for r in results)
    space = TuneSpec(**tomllib.loads(TUNE)["tune"]).space()
    assert {c.label for c in proposed} <= {KVCacheConfig(**point).label for point in space.points()}
