"""The new-experiment page's executor choice without Streamlit (the widget is ``pages/executor_choice.py``):
local worker processes, or one worker per node of a Ray cluster, whose nodes, CPUs and GPUs are shown
before launching.

The cluster is probed in a short subprocess (:func:`probe_cluster`), never by connecting the
dashboard's own process to Ray: a connection would stay open for the server's lifetime, and with no
cluster Ray would start one inside the dashboard.  A launch on Ray stores the experiment and starts a
detached driver (:func:`kvlab.dashboard.launch.launch_sweep`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from kvlab.experiments.ray_executor import INSTALL_HINT
from kvlab.store.database import resolve_url

LABELS = {"local": "Local workers", "ray": "Ray cluster (one worker per node)"}
PROBE = """
import json, logging, sys
import ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
print(json.dumps({"nodes": len(nodes), "cpus": sum(n.get("CPU", 0) for n in nodes),
                  "gpus": sum(n.get("GPU", 0) for n in nodes)}))
"""
PROBE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Executor:
    """What the form chose; ``problem``: why Launch is disabled (a missing extra, no cluster, SQLite on many nodes)."""

    kind: str = "local"  # or "ray"
    address: str | None = None
    problem: str | None = None


def ray_missing() -> str | None:
    """Why the dashboard cannot use Ray, if it cannot."""
    if importlib.util.find_spec("ray") is None:
        return f"Ray is not installed in the dashboard's environment; {INSTALL_HINT}"
    return None


def probe_cluster(address: str) -> dict[str, float] | str:
    """The cluster's alive ``nodes``, ``cpus`` and ``gpus``, or why it could not be reached (one line)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, address], capture_output=True, text=True, env=env,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer from the Ray cluster at {address} within {PROBE_TIMEOUT_S} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"could not reach the Ray cluster at {address}: {last[:300]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def store_problem(nodes: int) -> str | None:
    """SQLite is one file on one machine: refused for a cluster of several nodes."""
    if nodes > 1 and resolve_url().get_backend_name() == "sqlite":
        return ("this dashboard's store is a SQLite file, which only one machine can open: start it with "
                "KVLAB_DATABASE_URL set to a PostgreSQL URL that every node reaches")
    return None
