"""kvlab's processes make torch's OpenMP threads sleep when idle, and size them from the cores they may use.

libgomp (the OpenMP runtime of the PyPI torch wheels) prints the wait settings it loaded with when
``OMP_DISPLAY_ENV=VERBOSE``: its spin count is what decides whether an idle thread burns a core that
another process needs (300000 by default, 0 when passive).  Each test runs a real ``kvlab`` process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.waiting import SAFETY_S

WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _worker_spin_count(tmp_path, **extra: str) -> str:
    """The spin count libgomp loaded with in ``kvlab worker --exit-when-idle`` (on an empty store)."""
    env = {name: value for name, value in os.environ.items() if name not in WAIT_VARS}
    env |= {"KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}", "OMP_DISPLAY_ENV": "VERBOSE", **extra}
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "worker", "--exit-when-idle"],
                          env=env, capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("GOMP_SPINCOUNT = ")]
    if not lines:
        pytest.skip("torch here does not use GNU libgomp (nothing prints its spin count)")
    return lines[0].removeprefix("GOMP_SPINCOUNT = ").strip("'")


def test_a_worker_loads_torch_with_threads_that_sleep_when_idle(tmp_path):
    assert _worker_spin_count(tmp_path) == "0"


def test_a_wait_policy_in_the_environment_is_kept(tmp_path):
    assert int(_worker_spin_count(tmp_path, OMP_WAIT_POLICY="ACTIVE")) > 300_000  # spins, as asked


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to restrict a process to one")
def test_threads_follow_the_cores_a_process_may_use():
    script = ("import os, torch\n"
              "from kvlab.threads import set_torch_threads, share_of_cores\n"
              "first = torch.get_num_threads(), set_torch_threads(), share_of_cores(2)\n"
              "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"  # as `taskset -c 0` or a cpuset would
              "print(*first, set_torch_threads(), share_of_cores(2), set_torch_threads(3))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SAFETY_S, check=True)
    cores = len(os.sched_getaffinity(0))
    torch_default, *threads = map(int, done.stdout.split())
    assert threads == [min(torch_default, cores), max(1, cores // 2), 1, 1, 3]


def test_a_block_runs_on_the_threads_it_asks_for_and_leaves_them_as_they_were():
    import torch

    from kvlab.threads import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("a fault inside the block")
    with torch_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


def test_threads_sleep_where_the_wait_policy_is_passive():
    from kvlab.threads import share_cores, threads_sleep

    environ: dict[str, str] = {}
    share_cores(environ)
    assert threads_sleep(environ)
    assert not threads_sleep({"OMP_WAIT_POLICY": "ACTIVE"}) and not threads_sleep({"GOMP_SPINCOUNT": "10000"})
