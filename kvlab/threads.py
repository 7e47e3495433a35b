"""How kvlab's processes use the CPU: torch's threads share the cores with other processes.

torch runs its CPU kernels on OpenMP threads (GNU libgomp in the PyPI wheels, Intel's libiomp in
some other builds).  Between two parallel regions an idle OpenMP thread spins before it sleeps
(libgomp: about 3 ms by default; libiomp: ``KMP_BLOCKTIME``, 200 ms).  On an idle machine that
saves a wake-up; beside any other busy process (a browser, the test suite, a second run) the
spinning thread burns the very core that the thread it waits for needs, so every parallel region
waits for a time slice.  Measured on 2 cores with benchmarks/contention.py (``kvlab run`` of 3
configs x 4 passkey items at 1K tokens): alone 38 s (60 s of CPU); beside ``stress --cpu 2`` 218 s
(194 s of CPU) with spinning threads, 93 s (55 s of CPU) with threads that sleep at once.
:func:`share_cores` makes them sleep at once (``OMP_WAIT_POLICY=PASSIVE``, which both runtimes
read), unless the environment already chose a wait policy.

OpenMP reads its environment once, when torch's library loads, so :func:`share_cores` must run
before ``import torch``: every entry point of a process that imports torch calls it first (the
``kvlab`` command, the Ray actor).  Processes those start inherit the environment.

:func:`set_torch_threads` then sizes torch's thread pool from the cores this process may run on
(its affinity: ``taskset``, a container's cpuset), not the machine's, and
:func:`share_of_cores` splits them between local workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

#: The variables that choose how idle OpenMP threads wait (standard; libgomp's; libiomp's): when
#: one is set, its owner chose (``OMP_WAIT_POLICY=ACTIVE`` for a machine dedicated to one run).
WAIT_POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def share_cores(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make the OpenMP threads of torch, loaded after this call, sleep as soon as they are idle."""
    if not any(environ.get(name) for name in WAIT_POLICY_VARS):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


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
