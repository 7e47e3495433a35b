"""Contention benchmark: kvlab idle and beside other busy processes, its threads spinning or sleeping.

The same small embedded work three ways, each a real process:
  run     ``kvlab run --no-store`` of a passkey sweep (3 configs x --items items at --length tokens);
  worker  ``kvlab worker --exit-when-idle`` on the same experiment queued in a temporary SQLite store;
  serve   ``kvlab serve`` answering --requests completions of about --length tokens, one at a time
          (timed from the first request to the last answer; the model load is left out),
each idle and beside a competitor (``stress --cpu N``, N the cores available; one Python busy loop
per core where stress is not installed), with torch's idle OpenMP threads
  spin     spinning before they sleep: the OpenMP runtimes' defaults (libgomp GOMP_SPINCOUNT=300000,
           libiomp KMP_BLOCKTIME=200), what kvlab ran with before kvlab/threads.py;
  passive  sleeping at once (``OMP_WAIT_POLICY=PASSIVE``): kvlab's default until 2026-12-07, and still that of
           the processes it starts beside its own (the dashboard's workers, the playground's server);
  bounded  spinning briefly (libgomp GOMP_SPINCOUNT=10000, about 0.1 ms; libiomp KMP_BLOCKTIME=0);
  auto     kvlab's default (no variable set: :func:`kvlab.threads.share_cores` chooses bounded where no other
           thread is ready to run as the process starts, else passive; the competitor starts first).
Prints the wall and CPU seconds of each figure with the 1-minute load average before and after it,
then loaded / idle side by side.  Goal: loaded / idle <= 2 (wall) with passive threads.  A machine
that does other work meanwhile adds to both figures: read them with the load printed beside them.

Usage: flock /tmp/kvlab-bench.lock python benchmarks/contention.py [--items 4] [--length 1024]
       [--requests 4] [--modes run worker serve] [--policies spin passive bounded auto]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

from kvlab.engines.managed_server import ManagedServer, free_port
from kvlab.experiments.provenance import environment
from kvlab.spec_files import load_spec
from kvlab.store import Store
from kvlab.threads import CHOSEN_BY_KVLAB, WAIT_POLICY_VARS, available_cores

GOAL = 2.0
POLICIES: dict[str, dict[str, str]] = {"spin": {"GOMP_SPINCOUNT": "300000", "KMP_BLOCKTIME": "200"},
                                       "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # what kvlab sets by itself
                                       "bounded": {"GOMP_SPINCOUNT": "10000", "KMP_BLOCKTIME": "0"},
                                       "auto": {}}  # kvlab chooses
MODES = ("run", "worker", "serve")
KVLAB = [sys.executable, "-m", "kvlab.cli"]
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def spec_text(items: int, length: int) -> str:
    return f"""name = "contention"
model = "smollm2-135m"
seed = 0
[backend]
kind = "embedded"
[[tasks]]
name = "passkey"
context_lengths = [{length}]
depths = [0.5]
num_items = {items}
max_new_tokens = 8
[[configs]]
name = "baseline"
[[configs]]
name = "int4"
quant = "int4"
[[configs]]
name = "streaming-50"
evict = "streaming_llm"
ratio = 0.5
"""


def load() -> float:
    return os.getloadavg()[0]


@contextmanager
def competitor(loaded: bool) -> Iterator[str]:
    """One CPU-bound process per available core while the block runs (nothing when not ``loaded``)."""
    if not loaded:
        yield "idle"
        return
    cores = available_cores()
    if shutil.which("stress"):
        commands, name = [["stress", "--cpu", str(cores)]], f"stress --cpu {cores}"
    else:
        commands, name = [[sys.executable, "-c", "while True: pass"]] * cores, f"{cores} busy loops"
    processes = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                 for c in commands]
    time.sleep(1)  # its workers are running before the measured process starts
    try:
        yield name
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def child_seconds(command: list[str], env: dict[str, str], log: Path) -> tuple[float, float]:
    """Wall and CPU seconds of ``command`` run to its end (it must succeed); the CPU time is the
    process's own (its rusage), so a competitor's time never counts."""
    start = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}:\n{log.read_text()[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def measure_run(tmp: Path, env: dict[str, str], args: argparse.Namespace) -> tuple[float, float]:
    return child_seconds([*KVLAB, "run", str(tmp / "spec.toml"), "--no-store", "--quiet"], env, tmp / "run.log")


def measure_worker(tmp: Path, env: dict[str, str], args: argparse.Namespace) -> tuple[float, float]:
    url = f"sqlite:///{tmp / f'worker-{time.monotonic_ns()}.sqlite'}"
    with Store(url) as store:
        store.create_experiment(load_spec(tmp / "spec.toml")[0], environment(torch_facts=False))
    return child_seconds([*KVLAB, "worker", "--exit-when-idle"], env | {"KVLAB_DATABASE_URL": url},
                         tmp / "worker.log")


def measure_serve(tmp: Path, env: dict[str, str], args: argparse.Namespace) -> tuple[float, float]:
    port = free_port()
    prompt = FILLER * max(1, args.length // 20)  # about 20 tokens a sentence group
    server = ManagedServer([*KVLAB, "serve", "--port", str(port)], f"http://127.0.0.1:{port}/health",
                           tmp / "serve.log", env=env, startup_timeout_s=1800)
    with server, httpx.Client(timeout=1800) as http:
        process = psutil.Process(server.pid)
        cpu, start = sum(process.cpu_times()[:2]), time.perf_counter()
        for index in range(args.requests):
            answer = http.post(f"http://127.0.0.1:{port}/v1/completions",
                               json={"model": "smollm2-135m", "prompt": f"Note {index}. {prompt}", "max_tokens": 8})
            answer.raise_for_status()
        return time.perf_counter() - start, sum(process.cpu_times()[:2]) - cpu


MEASURES: dict[str, Callable[[Path, dict[str, str], argparse.Namespace], tuple[float, float]]] = {
    "run": measure_run, "worker": measure_worker, "serve": measure_serve}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    args = parser.parse_args()
    base = {name: value for name, value in os.environ.items() if name not in (*WAIT_POLICY_VARS, CHOSEN_BY_KVLAB)}
    print(f"{available_cores()} cores; {args.items} passkey items x 3 configs at {args.length} tokens; "
          f"serve: {args.requests} requests; load average at start {load():.2f}", flush=True)
    figures: dict[tuple[str, str, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "spec.toml").write_text(spec_text(args.items, args.length))
        for mode in args.modes:
            for policy in args.policies:
                for loaded in (False, True):
                    with competitor(loaded) as beside:
                        before = load()
                        wall, cpu = MEASURES[mode](tmp, base | POLICIES[policy], args)
                    figures[mode, policy, beside != "idle"] = wall, cpu
                    print(f"  {mode:6} {policy:7} {beside:15} wall {wall:6.1f} s  CPU {cpu:6.1f} s   "
                          f"load {before:.2f} -> {load():.2f}", flush=True)
    print("loaded / idle, wall (CPU):")
    missed = []
    for mode in args.modes:
        cells = []
        for policy in args.policies:
            (idle_wall, idle_cpu), (busy_wall, busy_cpu) = figures[mode, policy, False], figures[mode, policy, True]
            cells.append(f"{policy} {busy_wall / idle_wall:.2f}x ({busy_cpu / idle_cpu:.2f}x)")
            if policy == "passive" and busy_wall / idle_wall > GOAL:
                missed.append(f"{mode} {busy_wall / idle_wall:.2f}x")
        print(f"  {mode:6} " + "   ".join(cells))
    if missed:
        print(f"goal (passive loaded / idle <= {GOAL:g}) missed: " + ", ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
