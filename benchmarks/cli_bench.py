"""CLI start-up benchmark: whole-process wall time of the commands a user types most.

Fills a temporary SQLite store with a few synthetic finished experiments (tests/dashboard_data.py),
then runs each command as a fresh process ``--runs`` times and prints the medians side by side.
Goal: ``kvlab ls`` under 1 s on a 2-core machine.

Usage: python benchmarks/cli_bench.py [--runs 5] [--experiments 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the synthetic experiments live with the tests

from kvlab.store import Store  # noqa: E402
from tests.dashboard_data import populate  # noqa: E402

COMMANDS = (["--help"], ["ls"], ["show", "1"])
GOAL_S = {"ls": 1.0}
KVLAB = str(Path(sys.executable).with_name("kvlab"))


def wall_s(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``kvlab ARGV`` until it exits (it must succeed)."""
    start = time.perf_counter()
    subprocess.run([KVLAB, *argv], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--experiments", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'kvlab.sqlite'}"
        with Store(url) as store:
            for index in range(args.experiments):
                populate(store, name=f"sweep-{index}")
        env = {**os.environ, "KVLAB_DATABASE_URL": url, "KVLAB_HOME": str(Path(tmp) / "home")}
        wall_s(["ls"], env)  # one unmeasured run: the file cache holds the interpreter and the packages
        medians = {" ".join(argv): statistics.median(wall_s(argv, env) for _ in range(args.runs))
                   for argv in COMMANDS}
    print(f"whole-process median of {args.runs} runs, store of {args.experiments} experiments:")
    print("  ".join(f"kvlab {name}: {seconds:.2f} s" for name, seconds in medians.items()))
    missed = [f"kvlab {name} {medians[name]:.2f} s > {goal} s" for name, goal in GOAL_S.items() if medians[name] > goal]
    if missed:
        print("goal missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
