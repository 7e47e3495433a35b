"""kvlab's processes choose how torch's OpenMP threads wait when idle from what the machine is doing (a bounded
spin on an idle machine, sleeping at once beside busy processes or beside kvlab's own), and size them from the
cores they may use.

libgomp (the OpenMP runtime of the PyPI torch wheels) prints the wait settings it loaded with when
``OMP_DISPLAY_ENV=VERBOSE``: its spin count is what decides whether an idle thread burns a core that
another process needs (300000 by default, 0 when passive).  The kernel's count of threads ready to run is read
from a file the test writes (``$KVLAB_LOADAVG``), as ``/proc/loadavg`` shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvlab.threads import (
    BOUNDED_SPIN,
    CHOSEN_BY_KVLAB,
    LOADAVG_VAR,
    beside_others,
    others_ready,
    share_cores,
    threads_sleep,
)
from tests.waiting import SAFETY_S

WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


#: /proc/loadavg of an idle machine (the reader itself is the one thread ready to run) and of a busy one.
IDLE, BUSY = "0.02 0.05 0.01 1/180 4242\n", "2.10 1.90 1.50 3/180 4242\n"


def _worker_spin_count(tmp_path, loadavg: str = IDLE, **extra: str) -> str:
    """The spin count libgomp loaded with in ``kvlab worker --exit-when-idle`` (on an empty store), the machine as
    ``loadavg`` says."""
    (tmp_path / "loadavg").write_text(loadavg)
    env = {name: value for name, value in os.environ.items() if name not in (*WAIT_VARS, CHOSEN_BY_KVLAB)}
    env |= {"KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'kvlab.sqlite'}", "OMP_DISPLAY_ENV": "VERBOSE",
            LOADAVG_VAR: str(tmp_path / "loadavg"), **extra}
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "worker", "--exit-when-idle"],
                          env=env, capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("GOMP_SPINCOUNT = ")]
    if not lines:
        pytest.skip("torch here does not use GNU libgomp (nothing prints its spin count)")
    return lines[0].removeprefix("GOMP_SPINCOUNT = ").strip("'")


def test_a_worker_spins_briefly_on_an_idle_machine_and_sleeps_at_once_beside_busy_processes(tmp_path):
    assert _worker_spin_count(tmp_path, IDLE) == BOUNDED_SPIN["GOMP_SPINCOUNT"] == "10000"
    assert _worker_spin_count(tmp_path, BUSY) == "0"


def test_a_process_kvlab_starts_beside_its_own_sleeps_at_once_whatever_its_parent_chose(tmp_path):
    """The dashboard's workers and the playground's server run beside kvlab's own load: on an idle machine too
    (their parent's bounded spin is not inherited), but a policy the user chose is kept."""
    parent: dict[str, str] = {}
    (tmp_path / "loadavg").write_text(IDLE)
    os.environ[LOADAVG_VAR] = str(tmp_path / "loadavg")
    try:
        share_cores(parent)
    finally:
        del os.environ[LOADAVG_VAR]
    assert not threads_sleep(parent) and parent["GOMP_SPINCOUNT"] == "10000"
    assert _worker_spin_count(tmp_path, IDLE, **beside_others(parent)) == "0"
    assert beside_others({"OMP_WAIT_POLICY": "ACTIVE"}) == {}


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


def test_threads_sleep_where_the_wait_policy_is_passive(tmp_path, monkeypatch):
    (tmp_path / "loadavg").write_text(BUSY)
    monkeypatch.setenv(LOADAVG_VAR, str(tmp_path / "loadavg"))
    assert others_ready() == 2
    environ: dict[str, str] = {}
    share_cores(environ)
    assert threads_sleep(environ)
    assert not threads_sleep({"OMP_WAIT_POLICY": "ACTIVE"}) and not threads_sleep({"GOMP_SPINCOUNT": "10000"})
    monkeypatch.setenv(LOADAVG_VAR, str(tmp_path / "missing"))
    assert others_ready() is None  # the kernel does not say: sleep at once, the safe side
    share_cores(inherited := {"GOMP_SPINCOUNT": "10000", CHOSEN_BY_KVLAB: "1"})  # a kvlab parent's choice
    assert threads_sleep(inherited)
