"""`kvlab tune`'s refusals, as a whole process: one line, exit 2, nothing loaded or stored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import SAFETY_S

ROOT = Path(__file__).resolve().parents[2]


def kvlab_tune(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}"}
    return subprocess.run([sys.executable, "-m", "kvlab.cli", "tune", *args], env=env, capture_output=True,
                          text=True, timeout=SAFETY_S)


@pytest.mark.parametrize(("args", "message"), [
    (("examples/tiny.toml",), "no [tune] table: `kvlab run` runs a fixed list of configs"),
    ((), "give a spec with a [tune] table, or --resume ID"),
    (("examples/tune.toml", "--resume", "1"), "--resume continues the stored tune as it was"),
    (("--resume", "99"), "no experiment 99"),
    (("examples/tune.toml", "--ray-address", "auto"), "--ray-address is for --executor ray"),
    (("examples/tune.toml", "--max-trials", "0"), "argument --max-trials"),
])
def test_refusals_are_one_line(args, message, tmp_path):
    done = kvlab_tune(*[str(ROOT / a) if a.endswith(".toml") else a for a in args], tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_resuming_a_plain_experiment_is_refused(tmp_path):
    from kvlab.spec_files import load_spec
    from kvlab.store import Store
    from tests.store.test_store import ENV

    spec, _ = load_spec(ROOT / "examples" / "tiny.toml")
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        experiment_id = store.create_experiment(spec, ENV)
    done = kvlab_tune("--resume", str(experiment_id), tmp_path=tmp_path)
    assert done.returncode == 2 and f"experiment {experiment_id} is a sweep, not a tune" in done.stderr, done.stderr


def test_a_background_tune_is_refused_on_a_store_its_process_cannot_see(tmp_path):
    """Stored first and driven by a detached process: an in-memory store is refused before anything
    is stored, in one line."""
    env = {**os.environ, "KVLAB_DATABASE_URL": "sqlite://", "KVLAB_LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "tune", str(ROOT / "examples" / "tune.toml"),
                           "--background"], env=env, capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 2, done.stderr
    assert "is an in-memory SQLite database" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "logs").exists()  # no process started
