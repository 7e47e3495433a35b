"""A SIGBUS while a worker runs ends its process with exit 1 and one line (issue 47, row 13), not -7 without a
word: :func:`kvlab.store.database.ending_at_sigbus`.  The fault here is a real one, not a signal sent: a read
of a memory-mapped page past the end of a file cut short under it (what a refused write to SQLite's mapped -shm
file is too; tests/adversarial/test_cli_and_worker_faults.py makes that one with ``chattr +i``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kvlab.experiments.worker import Worker
from kvlab.store import Store
from tests.waiting import SAFETY_S

FAULT = """
import mmap, os, tempfile
def fault():
    fd, name = tempfile.mkstemp()
    os.write(fd, b"x" * mmap.PAGESIZE)
    mapped = mmap.mmap(fd, mmap.PAGESIZE)
    os.ftruncate(fd, 0)
    os.unlink(name)
    return mapped[0]  # SIGBUS: the page is past the end of the file now
"""


def _python(body: str) -> subprocess.CompletedProcess[str]:
    code = FAULT + "from kvlab.store.database import ending_at_sigbus\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_S)


def test_without_it_a_sigbus_kills_the_process_without_a_word():
    done = _python("fault()")
    assert done.returncode == -7 and done.stderr == ""


def test_inside_it_a_sigbus_is_exit_1_and_the_callers_line():
    done = _python("""
        with ending_at_sigbus(lambda: "the store sqlite:///x is gone"):
            fault()
        print("not reached")
    """)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "error: the store sqlite:///x is gone\n")


def test_the_innermost_callers_line_is_said_and_a_failing_describe_still_ends_the_process():
    done = _python("""
        with ending_at_sigbus(lambda: "outer"), ending_at_sigbus(lambda: "inner\\nsecond line \\x1b[2J"):
            fault()
    """)
    assert (done.returncode, done.stderr) == (1, "error: inner; second line \\x1b[2J\n")
    done = _python("""
        with ending_at_sigbus(lambda: 1 / 0):
            fault()
    """)
    assert (done.returncode, done.stderr) == (1, "error: this process ended at a SIGBUS: a memory-mapped file "
                                                 "failed under it\n")


def test_after_it_the_handler_before_it_is_back():
    """Left, the process's own SIGBUS handling returns: here faulthandler's traceback, then -7."""
    done = _python("""
        import faulthandler
        faulthandler.enable()
        with ending_at_sigbus(lambda: "inner"):
            pass
        fault()
    """)
    assert done.returncode == -7 and "Fatal Python error: Bus error" in done.stderr, done.stderr


@pytest.mark.parametrize("intact", [True, False])
def test_a_workers_line_names_its_store(tmp_path, intact):
    path = tmp_path / "kvlab.sqlite"
    with Store(f"sqlite:///{path}") as store:
        worker = Worker(store)
        if not intact:
            path.unlink()
        line = worker._sigbus_line()
    assert f"sqlite:///{path}" in line and line.endswith("its trials are requeued once their heartbeat is stale "
                                                         "(a worker's --stale-after-s)")
    assert line.startswith(f"worker {worker.worker_id} ended at a SIGBUS" if intact
                           else f"the store sqlite:///{path} is gone")
