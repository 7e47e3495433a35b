"""Workers never damage the queue (issue 9, items 2 and 3), with real ``kvlab worker`` processes
on a real database and the real default model:

* a worker with a bad option exits 2 with one line and claims nothing; a good worker beside it
  finishes everything and nothing is marked failed;
* a worker on a host without the model gives the trials back with the reason, and a worker that
  has the model completes them;
* deleting or cancelling an experiment while a worker runs it: the worker drops that work and
  completes the next queued experiment, exit status 0, no traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.store import ExperimentNotFoundError, Store
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model

WORKER = [sys.executable, "-m", "kvlab.cli", "worker"]
FAST = ["--exit-when-idle", "--threads", "1", "--heartbeat-s", "0.5", "--stale-after-s", "30"]
BAD_OPTIONS = [  # each: the flag its one-line error must name, and the allowed range it must state
    (["--telemetry-hz", "1000"], "--telemetry-hz 1000: allowed a number in 0.1..20"),
    (["--heartbeat-s", "5", "--stale-after-s", "3"], "--stale-after-s 3: allowed a number in 10.."),
    (["--max-trials", "0"], "--max-trials 0: allowed a whole number in 1..1000"),
    (["--threads", "-2"], "--threads -2: allowed a whole number in 1..4096"),
    (["--heartbeat-s", "nan"], "--heartbeat-s nan: allowed a number in 0.05..3600"),
]


def _spec(name: str, items: int, configs: int = 2) -> dict:
    return {"name": name, "seed": 3,
            "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": items,
                       "max_new_tokens": 2}],
            "configs": [{"name": "baseline"}, {"name": "int8", "quant": "int8"}][:configs]}


def _env(url: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, KVLAB_DATABASE_URL=url, **extra)


def _start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*WORKER, *FAST, *args], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _no_traceback(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    return text


def test_a_worker_with_a_bad_option_claims_nothing_and_a_good_one_finishes_everything(tmp_path):
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    store = Store(url)
    ids = [store.create_experiment(parse_spec(_spec(f"shared-{i}", items=1, configs=1)), {}) for i in range(2)]
    env = _env(url)
    good = _start(env, tmp_path / "good.log")
    try:
        for args, named in BAD_OPTIONS:  # meanwhile the good worker loads the model and works
            bad = subprocess.run([*WORKER, "--exit-when-idle", *args], env=env, capture_output=True, text=True,
                                 timeout=SAFETY_S)
            assert bad.returncode == 2, (args, bad.stderr)
            assert bad.stdout == "" and bad.stderr.count("\n") == 1, (args, bad.stderr)
            assert bad.stderr.startswith(f"error: {named}"), (args, bad.stderr)
        assert good.wait(timeout=SAFETY_S) == 0
    finally:
        if good.poll() is None:
            good.kill()
    _no_traceback(tmp_path / "good.log")
    for experiment_id in ids:
        assert store.get_experiment(experiment_id).status == "done"
        assert [(t.status, t.attempts) for t in store.trials(experiment_id)] == [("done", 1)]
        assert not [e for e in store.events(experiment_id) if e.level != "info"]


def test_a_host_without_the_model_gives_the_trials_back_and_another_worker_completes_them(tmp_path):
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    store = Store(url)
    experiment_id = store.create_experiment(parse_spec(_spec("needs-the-model", items=1)), {})
    bare_home = tmp_path / "bare-host-home"  # a host where `kvlab models pull` never ran
    lacking = _start(_env(url, KVLAB_HOME=str(bare_home)), tmp_path / "lacking.log")
    assert lacking.wait(timeout=SAFETY_S) == 1
    lines = _no_traceback(tmp_path / "lacking.log").splitlines()
    assert lines[-1].startswith(f"error: worker {socket.gethostname()}-{lacking.pid}-")
    assert f"left experiment(s) {experiment_id} in the queue" in lines[-1] and "not pulled yet" in lines[-1]
    assert [(t.status, t.attempts) for t in store.trials(experiment_id)] == [("queued", 1), ("queued", 1)]
    assert store.get_experiment(experiment_id).status != "failed"
    warnings = [e.message for e in store.events(experiment_id) if e.level == "warning"]
    assert len(warnings) == 1, warnings
    assert f"-{lacking.pid}-" in warnings[0] and "kvlab models pull smollm2-135m" in warnings[0]

    able = _start(_env(url), tmp_path / "able.log")
    assert able.wait(timeout=SAFETY_S) == 0
    _no_traceback(tmp_path / "able.log")
    assert [(t.status, t.attempts) for t in store.trials(experiment_id)] == [("done", 2), ("done", 2)]
    assert store.get_experiment(experiment_id).status == "done"
    assert not [e for e in store.events(experiment_id) if e.level == "error"]


def test_delete_and_cancel_while_a_worker_runs_then_it_completes_the_next_experiment(db_url, tmp_path):
    store = Store(db_url)
    long_items = 6
    deleted, cancelled, waiting = (store.create_experiment(parse_spec(_spec(name, items, configs=1)), {})
                                   for name, items in (("deleted", long_items), ("cancelled", long_items),
                                                       ("waiting", 1)))
    log = tmp_path / "worker.log"
    worker = _start(_env(db_url), log)
    try:
        def has_results(experiment_id: int):
            return lambda: bool(store.item_results(experiment_id))

        def claimed(experiment_id: int):
            return lambda: any(t.status != "queued" for t in store.trials(experiment_id))

        wait_until(has_results(deleted), "the first result of the experiment to delete", process=worker)
        store.delete_experiment(deleted)  # what the dashboard's Delete does
        deleted_at = time.monotonic()
        wait_until(claimed(cancelled), "the worker to move on after the delete", process=worker)
        noticed_delete = time.monotonic() - deleted_at

        wait_until(has_results(cancelled), "the first result of the experiment to cancel", process=worker)
        store.cancel_experiment(cancelled)
        cancelled_at = time.monotonic()
        wait_until(claimed(waiting), "the worker to move on after the cancel", process=worker)
        noticed_cancel = time.monotonic() - cancelled_at

        assert worker.wait(timeout=SAFETY_S) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    print(f"\nworker moved on {noticed_delete:.2f} s after the delete, {noticed_cancel:.2f} s after the cancel")
    text = _no_traceback(log)
    # No ERROR-level line (the log's level field; psycopg's WARNING about the pipeline that a write for
    # the deleted experiment aborted says "[INERROR, ...]" and is not one).
    assert "telemetry write failed" not in text and " ERROR " not in text, text[-3000:]
    with pytest.raises(ExperimentNotFoundError):
        store.get_experiment(deleted)
    assert store.get_experiment(cancelled).status == "cancelled"
    assert len(store.item_results(cancelled)) < long_items  # it stopped, it did not run to the end
    assert store.get_experiment(waiting).status == "done"
    assert [t.status for t in store.trials(waiting)] == ["done"]
