"""Background workers on a real database: 4 workers and a reader, one worker SIGKILLed mid-trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.experiments.provenance import environment
from kvlab.store import Store
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model

ITEMS = 3
SPEC = {
    "name": "kill-test", "seed": 2,
    "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": ITEMS,
               "max_new_tokens": 3}],
    "configs": [{"name": "baseline"}, {"name": "int8", "quant": "int8"}, {"name": "int4", "quant": "int4"},
                {"name": "int2", "quant": "int2"}, {"name": "fp8", "quant": "fp8_e4m3"},
                {"name": "knorm", "evict": "knorm", "ratio": 0.5}, {"name": "snapkv", "evict": "snapkv", "ratio": 0.5},
                {"name": "streaming", "evict": "streaming_llm", "ratio": 0.5}],
}

READER = textwrap.dedent("""
    import sys, time
    from kvlab.store import Store
    store, experiment_id = Store(), int(sys.argv[1])
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            store.list_experiments(); store.trials(experiment_id); store.item_results(experiment_id)
            store.telemetry(experiment_id, limit=100)
            if store.get_experiment(experiment_id).is_terminal:
                break
        except Exception as error:
            print("READER ERROR", type(error).__name__, error, flush=True)
        time.sleep(0.2)
""")


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "kvlab.cli", "worker", "--exit-when-idle", "--max-trials", "2", "--threads", "1",
            "--heartbeat-s", "1", "--stale-after-s", "8", "--telemetry-hz", "5"]
    return subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def test_four_workers_a_reader_and_a_sigkill(db_url, tmp_path):
    store = Store(db_url)
    experiment_id = store.create_experiment(parse_spec(SPEC), environment())
    env = dict(os.environ, KVLAB_DATABASE_URL=db_url)
    logs = [tmp_path / f"worker{i}.log" for i in range(4)]
    workers = [_start_worker(env, log) for log in logs]
    reader = subprocess.Popen([sys.executable, "-c", READER, str(experiment_id)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    by_pid = {w.pid: w for w in workers}
    try:
        def victim_trial():
            return next((t for t in store.trials(experiment_id)
                         if t.status == "running" and t.items_done >= 1 and t.items_done < ITEMS), None)

        wait_until(lambda: victim_trial() is not None, "a trial part-way through", poll_s=0.5)
        victim = victim_trial()
        pid = int(victim.worker_id.split("-")[-2])
        os.kill(pid, signal.SIGKILL)
        by_pid[pid].wait()
        wait_until(lambda: store.get_experiment(experiment_id).is_terminal, "the experiment to finish", poll_s=0.5)
        for worker in workers:
            worker.wait(timeout=SAFETY_S)
        reader_output, _ = reader.communicate(timeout=SAFETY_S)
    finally:
        for process in [*workers, reader]:
            if process.poll() is None:
                process.kill()

    trials = store.trials(experiment_id)
    assert [t.status for t in trials] == ["done"] * len(SPEC["configs"])
    finished = store.get_experiment(experiment_id)
    assert finished.status == "done" and finished.hardware["cpu_count"] and finished.versions["kvpress"] == "0.5.5"
    results = store.item_results(experiment_id)
    keys = [(r.config_name, r.item_id) for r in results]
    assert len(keys) == len(set(keys)) == len(SPEC["configs"]) * ITEMS  # nothing lost, nothing twice
    assert all(t.items_done == t.items_total == ITEMS for t in trials)
    resumed = next(t for t in trials if t.id == victim.id)
    assert resumed.attempts >= 2 and resumed.worker_id != victim.worker_id
    assert store.integrity_check() == "ok"
    assert "READER ERROR" not in reader_output, reader_output
    worker_output = "".join(log.read_text() for log in logs)
    assert "database is locked" not in worker_output
    assert "Traceback" not in worker_output, worker_output[-3000:]
    messages = [e.message for e in store.events(experiment_id)]
    assert any("stopped heartbeating" in m or "requeued" in m for m in messages), messages
    samples = store.telemetry(experiment_id)
    assert samples and {s.phase for s in samples} & {"prefill", "decode"}
    assert any(s.kv_bytes for s in samples) and all(s.rss_bytes for s in samples if s.source == "cpu")
