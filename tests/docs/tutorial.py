"""The tutorial's commands, read from ``docs/tutorial.md`` and run as a reader runs them.

Every line of every ``bash`` block is a command, except those :data:`NOT_RUN` names with the reason.  They
run with ``bash`` in a scratch directory that holds ``.venv`` (a link to this checkout's) and ``examples/``
(the tutorial's specs), against a store of their own.  :func:`reduce_spec` makes a spec small enough for
the suite (256-token contexts, two items); ``python -m tests.docs.tutorial`` runs them at full size and
prints each command's time (the tutorial's measured time).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
#: Commands the suite does not run, by how they start, and why.
NOT_RUN = {
    "scripts/setup.sh": "setting up is what the test command itself does first; the dashboard it starts never ends "
                        "(the browser tests drive it)",
}
#: Candidates a reduced tune proposes (the tutorial's --max-trials value is replaced by this).
REDUCED_TRIALS = "2"


def commands(markdown: str | None = None) -> list[str]:
    """The tutorial's command lines, in order (comments and blank lines dropped)."""
    text = TUTORIAL.read_text(encoding="utf-8") if markdown is None else markdown
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#") and not command.startswith(tuple(NOT_RUN)):
                lines.append(command)
    return lines


def reduce_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` at the suite's size: every task at 256 tokens with at most two items, a tune's first rung of two."""
    for task in spec.get("tasks", []):
        task["context_lengths"] = [256]
        task["num_items"] = min(task.get("num_items", 2), 2)
    if "tune" in spec:
        spec["tune"]["min_items"] = 2
    return spec


def prepare(workdir: Path, reduced: bool) -> dict[str, str]:
    """``workdir`` laid out for the commands, and their environment (a store of their own)."""
    (workdir / "examples").mkdir(parents=True, exist_ok=True)
    (workdir / "results").mkdir(exist_ok=True)
    venv = workdir / ".venv"
    if not venv.exists():
        venv.symlink_to(ROOT / ".venv")
    for spec in (ROOT / "examples").glob("*.toml"):
        data = tomllib.loads(spec.read_text(encoding="utf-8"))
        (workdir / "examples" / spec.name).write_text(tomli_w.dumps(reduce_spec(data) if reduced else data))
    return dict(os.environ, KVLAB_DATABASE_URL=f"sqlite:///{workdir / 'kvlab.sqlite'}", KVLAB_LOG_DIR=str(workdir))


def shrink(command: str) -> str:
    """A tune's ``--max-trials N`` at the suite's size (the flag itself stays as written)."""
    return re.sub(r"--max-trials \d+", f"--max-trials {REDUCED_TRIALS}", command)


def run(command: str, workdir: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def main() -> int:
    """Run the tutorial at full size in a scratch directory, printing each command's time."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvlab-tutorial-") as scratch:
        workdir = Path(scratch)
        env = prepare(workdir, reduced=False)
        started = time.monotonic()
        for command in commands():
            began = time.monotonic()
            done = run(command, workdir, env, timeout_s=3600)
            print(f"{time.monotonic() - began:7.1f} s  exit {done.returncode}  {command}", flush=True)
            print(done.stdout[-6000:], done.stderr[-2000:], sep="\n", flush=True)
        print(f"{time.monotonic() - started:7.1f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
