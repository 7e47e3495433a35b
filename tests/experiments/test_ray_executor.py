"""The Ray executor on a real two-node Ray cluster on 127.0.0.1 (two ``ray start`` processes, 1 CPU
each) against the test PostgreSQL: the tiny example with one node's worker process SIGKILLed
mid-trial (nothing lost, nothing duplicated), a cancel from ``kvlab cancel`` reaching the actors of
a ``kvlab run --executor ray``, the dashboard showing the cluster and launching on it, SQLite
refused on two nodes, and the message without the extra.  The cluster starts once per module; each
of the three runs loads the model on both nodes (112 s in all on 2 cores at load average 9-12).

Hook for the tune test (to be added here): ``cluster`` (module scope) is a :class:`RayCluster` with
``address`` and the ``env`` a subprocess needs to join it (this process is already connected), and
``pg_url`` an empty PostgreSQL schema: ``kvlab tune SPEC --executor ray --ray-address ADDRESS`` in a
subprocess with ``{**cluster.env, "KVLAB_DATABASE_URL": pg_url}``, as the cancel test runs ``kvlab run``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.experiments.nodes import node_of
from kvlab.experiments.submit import store_experiment
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.spec_files import load_spec
from kvlab.store import Store, StoreError
from tests.conftest import PG_URL
from tests.waiting import SAFETY_S, wait_until

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
NO_RAY = """
import sys
class _NoRay:  # what a Python without the kvlab[ray] extra answers to `import ray`
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoRay())
"""


@dataclass(frozen=True)
class RayCluster:
    address: str
    env: dict[str, str]  # joins the cluster (token auth)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    """A head and a second node, 1 CPU each, with their session files in a fresh short temp dir
    (Ray's socket paths must stay under 108 bytes); this process is connected to it as a driver.
    Each ``ray start --block`` stops its node's processes when terminated (never ``ray stop``, which
    would stop every Ray on the machine)."""
    temp = Path(tempfile.mkdtemp(prefix="kvray", dir="/tmp"))
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats",
              "--dashboard-agent-listen-port", str(_free_port())]
    head = [str(RAY), "start", "--head", "--port", str(port), "--temp-dir", str(temp), "--include-dashboard=false",
            "--dashboard-port", str(_free_port()), *common]
    second = [str(RAY), "start", "--address", f"127.0.0.1:{port}", *common[:-1], str(_free_port())]
    nodes: list[subprocess.Popen] = []
    started = False
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=env["RAY_AUTH_TOKEN"])  # before Ray reads them
    try:
        ray = pytest.importorskip("ray", reason="Ray (kvlab[ray]) is not installed: scripts/setup.sh --dev installs it")
    except BaseException:
        _restore(saved)
        raise
    try:
        for index, command in enumerate((head, second)):
            with open(temp / f"node{index}.log", "wb") as log:
                nodes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True))
            if index == 0:  # the second node joins a head that answers
                wait_until(lambda: _connect(ray, f"127.0.0.1:{port}"), f"the head node (its log: {temp / 'node0.log'})",
                           process=nodes[0], poll_s=0.5)
        wait_until(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, "two alive nodes", poll_s=0.5)
        yield RayCluster(f"127.0.0.1:{port}", env)
        started = True
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _restore(saved)
        for node in reversed(nodes):
            node.terminate()
        for node in nodes:
            try:
                node.wait(timeout=SAFETY_S)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
        if started:  # else the session's logs say why the cluster did not start
            shutil.rmtree(temp, ignore_errors=True)


def _restore(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _connect(ray: Any, address: str) -> bool:
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except Exception:  # noqa: BLE001 -- the head is still starting
        return False
    return True


@pytest.fixture
def pg_url(pg_admin) -> Iterator[str]:
    """An empty PostgreSQL schema, first on the search path."""
    schema = f"test_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    yield make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False)
    with pg_admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")


def _tiny(num_items: int):
    spec, _ = load_spec(ROOT / "examples" / "tiny.toml")
    return spec.model_copy(update={"tasks": [spec.tasks[0].model_copy(update={"num_items": num_items})]})


def test_tiny_on_two_nodes_loses_and_duplicates_nothing_when_a_worker_is_killed(cluster, pg_url):
    from kvlab.experiments.ray_executor import RayWorkers

    items = 3
    spec = _tiny(items)
    store = Store(pg_url)
    experiment_id = store_experiment(store, spec)
    # 2 trials per claim: one node takes two configs, the other one; the killed worker's trial is requeued
    # at once by its restarted actor (same worker id), not after stale_after_s
    settings = WorkerSettings(max_trials=2, heartbeat_s=1.0)
    # as a tune drives them: the workers keep polling for trials until the driver stops them
    with RayWorkers(pg_url, experiment_id, spec, exit_when_idle=False, settings=settings) as workers:
        before = {info["worker_id"]: info["pid"] for info in workers.info()}
        assert len(before) == 2 and len({node_of(worker) for worker in before}) == 2
        victim = wait_until(lambda: next(
            (t for t in store.trials(experiment_id) if t.status == "running" and t.items_total
             and 0 < t.items_done < t.items_total), None), "a trial with some but not all items stored")
        os.kill(before[victim.worker_id], signal.SIGKILL)
        wait_until(lambda: store.get_experiment(experiment_id).is_terminal, "the experiment's end", poll_s=0.5)
        after = {info["worker_id"]: info["pid"] for info in workers.info()}
        assert len(workers.outcomes()) == 0  # still polling
        outcomes = workers.wait(stop_when=lambda: True)
    assert sorted(o.worker_id for o in outcomes) == sorted(before) and [o.error for o in outcomes] == [None, None]
    assert after.keys() == before.keys() and after[victim.worker_id] != before[victim.worker_id]  # restarted
    assert store.get_experiment(experiment_id).status == "done"
    results = store.item_results(experiment_id)
    keys = [(r.config_name, r.item_id) for r in results]
    assert len(keys) == len(set(keys)) == 3 * items  # every config on every item, once
    trials = {t.id: t for t in store.trials(experiment_id)}
    assert trials[victim.id].attempts == 2 and all(t.status == "done" for t in trials.values())
    assert {t.worker_id for t in trials.values()} <= set(before)
    released = [e.message for e in store.events(experiment_id) if "Ray restarted it" in e.message]
    assert len(released) == 1 and victim.worker_id in released[0]
    assert {s.worker_id for s in store.telemetry(experiment_id)} == set(before)  # each node's telemetry


def test_cancel_from_the_cli_reaches_the_ray_workers_within_seconds(cluster, pg_url, tmp_path):
    spec = tmp_path / "long.toml"
    spec.write_text((ROOT / "examples" / "tiny.toml").read_text().replace("num_items = 2", "num_items = 30"))
    env = {**cluster.env, "KVLAB_DATABASE_URL": pg_url}
    run = subprocess.Popen([sys.executable, "-m", "kvlab.cli", "run", str(spec), "--quiet", "--executor", "ray",
                            "--ray-address", cluster.address], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        store = Store(pg_url)
        experiment = wait_until(lambda: next((e for e in store.list_experiments() if e.items_done), None),
                                "an item result", process=run, poll_s=0.2)
        cancel = subprocess.run([sys.executable, "-m", "kvlab.cli", "cancel", str(experiment.id)], env=env,
                                capture_output=True, text=True, timeout=SAFETY_S)
        cancelled = time.monotonic()
        assert cancel.returncode == 0, cancel.stderr
        _, stderr = run.communicate(timeout=SAFETY_S)
        took = time.monotonic() - cancelled
    finally:
        run.kill()
    # the workers see it at their next heartbeat (5 s), finish the item at hand and return; the driver ends
    assert took < 20, took
    assert run.returncode == 2 and "was cancelled while it ran" in stderr, stderr
    trials = store.trials(experiment.id)
    assert {t.status for t in trials} == {"cancelled"}
    assert len(store.item_results(experiment.id)) < 3 * 30


TUNE = """
name = "tune-on-ray"
model = "smollm2-135m"
max_drop = 0.5

[[tasks]]
name = "passkey"
context_lengths = [300]
depths = [0.5]
num_items = 4

[tune]
quant = ["none", "int8", "int2"]
min_items = 2
eta = 2
candidates_per_round = 2
max_trials = 2
"""


def test_a_short_tune_runs_through_the_cluster(cluster, pg_url, tmp_path):
    spec = tmp_path / "tune.toml"
    spec.write_text(TUNE)
    env = {**cluster.env, "KVLAB_DATABASE_URL": pg_url}
    tune = subprocess.run([sys.executable, "-m", "kvlab.cli", "tune", str(spec), "--executor", "ray",
                           "--ray-address", cluster.address], env=env, capture_output=True, text=True, timeout=SAFETY_S)
    assert tune.returncode == 0, tune.stderr
    with Store(pg_url) as store:
        (experiment,) = store.list_experiments()
        assert store.tune(experiment.id).state == "done" and experiment.status == "done"
        trials = store.trials(experiment.id)
        assert all(t.worker_id and t.worker_id.startswith("ray:") for t in trials)  # the actors ran every round
        results = store.item_results(experiment.id)
        assert len({(r.config_name, r.item_id) for r in results}) == len(results) == sum(t.items_done for t in trials)
    assert "recommended:" in tune.stdout or "no config passes the rule" in tune.stdout


def test_a_sqlite_store_is_refused_on_two_nodes(cluster, tmp_path):
    from kvlab.experiments.ray_executor import RayWorkers

    with pytest.raises(ConfigError, match=r"^the Ray cluster has 2 nodes but the store is a SQLite file"):
        RayWorkers(f"sqlite:///{tmp_path / 'kvlab.sqlite'}", 1, _tiny(1))


def test_the_address_probe_lets_the_cluster_through_and_says_when_its_token_is_missing(cluster, tmp_path):
    """A good address passes :func:`check_ray_address` (this process has the cluster's token); a
    ``kvlab run`` without any token is refused at once, not after Ray's 20 s of retries."""
    from kvlab.experiments.ray_executor import check_ray_address

    check_ray_address(cluster.address)
    env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_AUTH")}
    env |= {"HOME": str(tmp_path), "KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}"}  # no ~/.ray token
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "run", str(ROOT / "examples" / "tiny.toml"),
                           "--executor", "ray", "--ray-address", cluster.address], env=env, capture_output=True,
                          text=True, timeout=SAFETY_S)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: --ray-address '{cluster.address}': the cluster at ")
    assert "uses token authentication and this host has no token" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "kvlab.sqlite").exists()


def test_an_in_memory_store_is_refused_for_the_actors():
    from kvlab.experiments.ray_executor import actor_store_url

    for url in ("sqlite://", "sqlite:///:memory:"):
        with pytest.raises(StoreError, match="is an in-memory SQLite database, which only this process sees"):
            actor_store_url(url, 1)


def test_placement_takes_the_nodes_with_the_resources_the_spec_asks_for():
    from kvlab.experiments.ray_executor import plan_placement

    def node(name: str, cpus: float, gpus: float = 0, alive: bool = True) -> dict[str, Any]:
        return {"NodeID": name, "Alive": alive, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}

    nodes = [node("a", 1), node("b", 8, 2), node("c", 8, 2, alive=False)]
    tiny = _tiny(1)
    assert [n["NodeID"] for n in plan_placement(tiny.model_copy(update={"backend": tiny.backend.model_copy(
        update={"device": "cpu"})}), nodes).nodes] == ["a", "b"]  # 1 CPU, no GPU
    auto = plan_placement(tiny, nodes)  # device auto on a cluster with GPUs: 1 GPU each
    assert (auto.num_cpus, auto.num_gpus, [n["NodeID"] for n in auto.nodes]) == (1, 1, ["b"])
    asks = parse_spec({**tiny.model_dump(mode="json", exclude_none=True), "resources": {"num_cpus": 4, "num_gpus": 0}})
    assert [n["NodeID"] for n in plan_placement(asks, nodes).nodes] == ["b"]
    with pytest.raises(ConfigError, match=r"no node of the Ray cluster \(1 alive\) has 1 CPU\(s\) and 1 GPU\(s\)"):
        plan_placement(tiny.model_copy(update={"backend": tiny.backend.model_copy(update={"kind": "vllm"})}),
                       [node("a", 4)])


def test_without_the_extra_executor_ray_says_how_to_install_it(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_RAY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'k.sqlite'}"}
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "run", str(ROOT / "examples" / "tiny.toml"),
                           "--executor", "ray"], env=env, capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 2
    assert re.fullmatch(r"error: .*Ray.*not installed.*; install it with: pip install 'kvlab\[ray\]'\n", done.stderr)
    assert not (tmp_path / "k.sqlite").exists()  # refused before anything was stored


def test_the_new_experiment_page_shows_the_cluster_and_launches_on_it(cluster, pg_url, tmp_path, monkeypatch):
    from tests.dashboard.test_dashboard import NEW, assert_clean, open_page, texts

    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    at = open_page(NEW)
    at.radio(key="executor").set_value("ray").run()
    assert_clean(at)
    assert {m.label: m.value for m in at.metric if m.label in ("Nodes", "CPUs", "GPUs")} == {
        "Nodes": "2", "CPUs": "2", "GPUs": "0"}
    assert "store is a SQLite file" in texts(at.error) and at.button(key="launch").disabled

    monkeypatch.setenv("KVLAB_DATABASE_URL", pg_url)
    at = open_page(NEW)
    at.selectbox(key="example_pick").set_value("tiny").run()
    at.button(key="load_example").click().run()
    at.radio(key="executor").set_value("ray").run()
    at.button(key="launch").click().run()
    assert_clean(at)
    with Store(pg_url) as store:  # its Ray driver runs in the background: its workers claim, then it is cancelled
        [queued] = store.list_experiments()
        wait_until(lambda: any((t.worker_id or "").startswith("ray:") for t in store.trials(queued.id)),
                   "a trial claimed by a Ray worker", poll_s=0.2)
        store.cancel_experiment(queued.id)
    log = tmp_path / "logs" / f"ray-driver-{queued.id}.log"
    wait_until(lambda: "was cancelled while it ran" in log.read_text(), "the driver's end", poll_s=0.5)


def test_node_of_names_the_machine_that_ran_a_trial():
    assert node_of("ray:gpu-host-3:1f65deae:ab12cd") == "gpu-host-3 (ray node 1f65deae)"
    assert node_of("my-host-2-1234-abcdef") == "my-host-2"  # a plain worker: HOST-PID-RANDOM
    assert node_of(None) == "-"


@pytest.mark.parametrize(("visible", "handle"), [(None, "gpu0"), ("3,5", "gpu3"), ("GPU-8f2a", "GPU-8f2a")])
def test_gpu_telemetry_samples_the_gpu_ray_granted(visible, handle, monkeypatch):
    """A Ray actor granted GPU 3 sees CUDA_VISIBLE_DEVICES=3 (or a UUID); NVML counts every GPU of the host."""
    from kvlab.experiments.telemetry import NvmlSource
    from tests.experiments.test_telemetry import FakeNvml

    class ByUUID(FakeNvml):
        def nvmlDeviceGetHandleByUUID(self, uuid):
            return uuid

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert NvmlSource(nvml=ByUUID()).handle == handle
