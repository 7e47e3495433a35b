"""Losing the store under a running worker (issue 18, item 11), with real ``kvlab worker`` and
``kvlab run`` processes, the real default model and a real SQLite file:

* the file deleted mid-run: SQLite would go on writing to the deleted inode and the worker would
  exit 0 with every result gone; it must stop with exit 1 and one line naming the store;
* the file made read-only mid-run: the same, instead of a misleading "trials back in the queue";
* ``kvlab run``'s in-process worker likewise, printing no results table;
* an in-memory SQLite URL for anything that queues work for another process: exit 2, one line.

Each test waits for the first item result row before it pulls the store away, and then for the
process to end by itself.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.errlog import one_line
from kvlab.store import Store
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model

KVLAB = [sys.executable, "-m", "kvlab.cli"]
WORKER = [*KVLAB, "worker", "--exit-when-idle", "--threads", "1", "--heartbeat-s", "0.5", "--stale-after-s", "30"]
#: Long enough that the store is pulled away while the worker is in the middle of it.
SPEC = {"name": "long", "seed": 3,
        "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": 40, "max_new_tokens": 2}],
        "configs": [{"name": "baseline"}, {"name": "int8", "quant": "int8"}]}
TOML = """name = "long"
seed = 3
[[tasks]]
name = "passkey"
context_lengths = [256]
depths = [0.5]
num_items = 40
max_new_tokens = 2
[[configs]]
name = "int8"
quant = "int8"
"""


def _results(path: Path) -> int:
    """Item result rows in the file, read the way a second process would (0 until it has the table)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as connection:
            return connection.execute("SELECT count(*) FROM item_results").fetchone()[0]
    except sqlite3.Error:
        return 0


def _wait_for_a_result(path: Path, process: subprocess.Popen) -> None:
    wait_until(lambda: _results(path) >= 1, f"a first item result in {path}", process=process, poll_s=0.1)


def _ended(process: subprocess.Popen, log: Path) -> tuple[int, list[str]]:
    """The exit status once the process has ended by itself, and its error lines."""
    status = process.wait(timeout=SAFETY_S)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    return status, [line for line in text.splitlines() if line.startswith("error:")]


def _without_root_powers() -> list[str]:
    """A prefix under which file permissions apply to this process's children even as root (see
    tests/store/test_store.py's _without_root_powers)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: chmod cannot make a file read-only for root")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def _queued(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "kvlab.sqlite"
    with Store(f"sqlite:///{path}") as store:
        store.create_experiment(parse_spec(SPEC), {})
    return path, dict(os.environ, KVLAB_DATABASE_URL=f"sqlite:///{path}")


def test_a_worker_whose_sqlite_file_is_deleted_stops_with_exit_1_naming_the_store(tmp_path):
    path, env = _queued(tmp_path)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(WORKER, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        _wait_for_a_result(path, worker)
        for file in path.parent.iterdir():  # the file and its -wal and -shm: `rm db/kvlab.sqlite*`
            file.unlink()
        status, errors = _ended(worker, log)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert status == 1
    assert errors == ["error: " + one_line(f"the store sqlite:///{path} is gone: its file was deleted or replaced "
                                           f"while this process used it, and nothing it writes there now would be kept "
                                           f"({path})")]


def test_a_worker_whose_sqlite_file_turns_read_only_stops_with_exit_1_naming_the_store(tmp_path):
    prefix = _without_root_powers()
    path, env = _queued(tmp_path)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([*prefix, *WORKER], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        _wait_for_a_result(path, worker)
        for file in [*path.parent.iterdir(), path.parent]:  # `chmod -R a-w db`
            file.chmod(file.stat().st_mode & ~0o222)
        status, errors = _ended(worker, log)
    finally:
        if worker.poll() is None:
            worker.kill()
        for file in [path.parent, *path.parent.iterdir()]:
            file.chmod(file.stat().st_mode | 0o200)
    assert status == 1
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"error: the store sqlite:///{path} ")
    assert "can no longer be written" in errors[0] or "became read-only" in errors[0], errors[0]
    assert "back in the queue" not in log.read_text()  # it could not give them back: it must not say so


def test_kvlab_run_whose_sqlite_file_is_deleted_reports_no_results_and_exits_1(tmp_path):
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "kvlab.sqlite"
    spec = tmp_path / "long.toml"
    spec.write_text(TOML)
    stdout, stderr = tmp_path / "run.out", tmp_path / "run.err"
    env = dict(os.environ, KVLAB_DATABASE_URL=f"sqlite:///{path}")
    run = subprocess.Popen([*KVLAB, "run", str(spec), "--quiet"], env=env, stdout=stdout.open("wb"),
                           stderr=stderr.open("wb"))
    try:
        _wait_for_a_result(path, run)
        for file in folder.iterdir():
            file.unlink()
        status, errors = _ended(run, stderr)
    finally:
        if run.poll() is None:
            run.kill()
    assert status == 1
    assert errors == ["error: " + one_line(f"the store sqlite:///{path} is gone: its file was deleted or replaced "
                                           f"while this process used it, and nothing it writes there now would be kept "
                                           f"({path})")]
    assert stdout.read_text() == ""  # no table, no "N evaluations": nothing reported as done


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?uri=true",
                                 "sqlite:///file:kv?mode=memory&cache=shared&uri=true"])
@pytest.mark.parametrize("command", [["run", "examples/tiny.toml", "--background", "--workers", "0"],
                                     ["run", "examples/tiny.toml", "--background"],
                                     ["tune", "examples/tune.toml", "--background"]],
                         ids=["run-background-no-workers", "run-background", "tune-background"])
def test_an_in_memory_store_is_refused_for_work_queued_for_other_processes(url, command, tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, KVLAB_DATABASE_URL=url, KVLAB_LOG_DIR=str(tmp_path / "logs"))
    done = subprocess.run([*KVLAB, *command], env=env, cwd=root, capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # never "queued"
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: KVLAB_DATABASE_URL={url} is an "
                                                                   "in-memory SQLite database"), done.stderr
    assert not (tmp_path / "logs").exists()  # no worker or tune process was started
