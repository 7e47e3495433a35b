"""How kvlab's processes use the CPU: torch's threads share the cores with other processes.

torch runs its CPU kernels on OpenMP threads (GNU libgomp in the PyPI wheels, Intel's libiomp in
some other builds).  Between two parallel regions an idle OpenMP thread spins before it sleeps
(libgomp: about 3 ms by default; libiomp: ``KMP_BLOCKTIME``, 200 ms).  On an idle machine that
saves a wake-up; beside any other busy process (a browser, the test suite, a second run) the
spinning thread burns the very core that the thread it waits for needs, so every parallel region
waits for a time slice.  Measured on 2 cores with benchmarks/contention.py (``kvlab run`` of 3
configs x 4 passkey items at 1K tokens): alone 38 s (60 s of CPU); beside ``stress --cpu 2`` 218 s
(194 s of CPU) with spinning threads, 93 s (55 s of CPU) with threads that sleep at once.  Sleeping
threads cost an idle run the other way: each parallel region wakes them, and a 2-core machine ran
kvlab at 1.33 cores busy.  So :func:`share_cores` chooses from what the machine is doing as the
process starts, unless the environment already chose a wait policy:

- idle (no other thread ready to run): a **bounded spin** (libgomp ``GOMP_SPINCOUNT=10000``, about
  0.1 ms; libiomp ``KMP_BLOCKTIME=0``), which keeps the gaps between a forward's kernels busy;
- busy: sleep at once (``OMP_WAIT_POLICY=PASSIVE``, which both runtimes read).

A process kvlab starts beside its own others (the dashboard's workers and tune drivers, the
playground's server) sleeps at once whatever it finds (:func:`beside_others`): the product's own
load is there for as long as they live.  Measured with ``benchmarks/contention.py`` (docs/decisions.md).

OpenMP reads its environment once, when torch's library loads, so :func:`share_cores` must run
before ``import torch``: every entry point of a process that imports torch calls it first (the
``kvlab`` command, the Ray actor).  Processes those start inherit the environment.

:func:`set_torch_threads` then sizes torch's thread pool from the cores this process may run on
(its affinity: ``taskset``, a container's cpuset), not the machine's, and
:func:`share_of_cores` splits them between local workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

#: The variables that choose how idle OpenMP threads wait (standard; libgomp's; libiomp's): when
#: one is set, its owner chose (``OMP_WAIT_POLICY=ACTIVE`` for a machine dedicated to one run).
WAIT_POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: Set where kvlab, not the user, chose the wait policy: a process it starts chooses afresh.
CHOSEN_BY_KVLAB = "KVLAB_WAIT_POLICY_CHOSEN"
#: Every variable set, so that the policy holds whatever the environment it is added to held.
SLEEP_AT_ONCE = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "0"}
BOUNDED_SPIN = {"GOMP_SPINCOUNT": "10000", "KMP_BLOCKTIME": "0"}
#: Where the kernel counts the threads ready to run; ``$KVLAB_LOADAVG`` names another file (a test's).
LOADAVG, LOADAVG_VAR = "/proc/loadavg", "KVLAB_LOADAVG"


def others_ready(reads: int = 3, gap_s: float = 0.01) -> int | None:
    """The fewest threads but this one ready to run over ``reads`` reads of the kernel's count (``/proc/loadavg``'s
    fourth field, runnable/total): a competitor that keeps a core busy is in every read, a passing one is not.
    None where the kernel does not say (not Linux)."""
    path = os.environ.get(LOADAVG_VAR) or LOADAVG
    fewest: int | None = None
    for read in range(reads):
        if read:
            time.sleep(gap_s)
        try:
            with open(path, encoding="ascii") as handle:
                runnable = int(handle.read().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return None
        fewest = runnable - 1 if fewest is None else min(fewest, runnable - 1)  # less the reader itself
    return fewest


def share_cores(environ: MutableMapping[str, str] = os.environ) -> None:
    """Choose how the OpenMP threads of torch, loaded after this call, wait when idle: a bounded spin where no
    other thread is ready to run, else sleeping at once; a policy the environment chose is kept."""
    if environ.get(CHOSEN_BY_KVLAB):  # inherited from a kvlab process: this one chooses for itself
        for name in WAIT_POLICY_VARS:
            environ.pop(name, None)
    elif any(environ.get(name) for name in WAIT_POLICY_VARS):
        return
    environ.update(BOUNDED_SPIN if others_ready() == 0 else SLEEP_AT_ONCE)
    environ[CHOSEN_BY_KVLAB] = "1"


def beside_others(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What to add to the environment of a process kvlab starts beside its own others (a worker next to the
    dashboard, the playground's server next to the workers) so that its threads sleep at once, whatever this
    process chose; nothing where the user chose a policy."""
    if not environ.get(CHOSEN_BY_KVLAB) and any(environ.get(name) for name in WAIT_POLICY_VARS):
        return {}
    return SLEEP_AT_ONCE | {CHOSEN_BY_KVLAB: ""}  # empty: the child keeps this policy rather than choosing


def threads_sleep(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether idle OpenMP threads sleep at once in this process (:func:`share_cores`'s policy, or the user's)."""
    return environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch's CPU threads at ``count`` for the block, then as they were (None: left as they are)."""
    import torch

    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity mask
        return os.cpu_count() or 1


def share_of_cores(processes: int) -> int:
    """Threads for each of ``processes`` local workers started together: more would make them take
    turns on the cores (measured before the wait policy: a 320-token prefill took 7.2 s instead of
    0.7 s beside one competing worker)."""
    return max(1, available_cores() // max(1, processes))


def set_torch_threads(threads: int | None = None) -> int:
    """Size torch's CPU thread pool: ``threads``, else the cores available to this process (no more
    than torch's own default, which honours ``OMP_NUM_THREADS``, as a Ray actor's is set); returns it."""
    import torch

    count = threads or max(1, min(torch.get_num_threads(), available_cores()))
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
