"""A serving engine added from outside kvlab: one module and one entry-point line
(tests/fake_engines/plugin: ``kvlab_minimal_engine.py`` and its package's ``entry_points.txt``), found by
``kvlab run`` in its own process and run through a sweep like any engine -- launched per KV setting, its items
scored, its fidelity measured against the baseline's server -- with nothing of it in kvlab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from kvlab.core.kv_config import KVCacheConfig
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model

PLUGIN = Path(__file__).resolve().parents[1] / "fake_engines" / "plugin"


def kvlab(tmp_path: Path, *args: str, plugin: Path = PLUGIN) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]),
           "KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}"}
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *args], env=env, text=True, capture_output=True,
                          timeout=SAFETY_S, cwd=tmp_path)


def test_a_plugged_in_engine_runs_a_sweep_through_kvlab_run(tmp_path):
    spec = tmp_path / "minimal.toml"
    spec.write_text(tomli_w.dumps({
        "name": "plugin", "model": "smollm2-135m",
        "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": 2,
                   "max_new_tokens": 8}],
        "sweep": {"quant": ["int8"]},
        "backend": {"kind": "minimal", "server": {"python": sys.executable, "startup_timeout_s": SAFETY_S}}}))
    done = kvlab(tmp_path, "run", str(spec), "--json", str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "not loaded" not in done.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    launches = document["engine"]["launches"]
    assert [launch["config"] for launch in launches] == ["baseline", KVCacheConfig(quant="int8").label]
    assert [launch["command"][launch["command"].index("--quant") + 1] for launch in launches] == ["none", "int8"]
    rows = document["results"]
    assert len(rows) == 4 and all(row["error"] is None and row["score"] is not None for row in rows)
    # the int8 server scored the baseline server's samples: a fidelity per item, as on vLLM
    assert all(row["fidelity"] is not None for row in rows if row["config_name"] == "int8")
    listed = kvlab(tmp_path, "engines")
    assert listed.returncode == 0 and "minimal" in listed.stdout and "Minimal engine" in listed.stdout


def test_a_broken_plugin_is_one_line_and_kvlab_goes_on(tmp_path):
    """A plugin whose entry cannot be loaded is said, once, and left out: the built-in backends still run."""
    broken = tmp_path / "broken"
    info = broken / "kvlab_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvlab-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvlab.backends]\nbroken = kvlab_no_such_module:BACKEND\n")
    listed = kvlab(tmp_path, "engines", plugin=broken)
    assert listed.returncode == 0, listed.stderr
    said = [line for line in listed.stderr.splitlines() if "not loaded" in line]
    assert said == ["kvlab: backend plugin 'broken' (kvlab_no_such_module:BACKEND) not loaded: "
                    "ModuleNotFoundError: No module named 'kvlab_no_such_module'"]
    assert "embedded" in listed.stdout and "broken" not in listed.stdout
