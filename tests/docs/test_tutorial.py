"""The tutorial's commands run as written (``tests/docs/tutorial.py``), at a reduced size: a renamed command or
flag, or a spec of ``examples/`` that no longer parses, fails here before it fails a reader."""

from __future__ import annotations

import json

import pytest

from tests.docs.tutorial import commands, prepare, run, shrink

pytestmark = pytest.mark.model  # every command loads the real default model


def test_the_tutorials_commands_are_found():
    found = commands()
    assert any(c.startswith(".venv/bin/kvlab run ") for c in found)
    assert any(c.startswith(".venv/bin/kvlab tune ") for c in found)


def test_a_command_the_suite_does_not_run_must_say_why():
    text = "```bash\nscripts/setup.sh && x\n.venv/bin/kvlab ls   # a comment\n# only a comment\n```\n"
    assert commands(text) == [".venv/bin/kvlab ls"]


def test_the_tutorial_runs(tmp_path):
    env = prepare(tmp_path, reduced=True)
    for command in commands():
        done = run(shrink(command), tmp_path, env, timeout_s=600)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stderr[-3000:]}"
    quick = json.loads((tmp_path / "results" / "quick.json").read_text())
    assert "sweet_spot" in quick, "the decided sweep says its sweet spot (or why there is none)"
    assert (tmp_path / "results" / "tune.json").is_file() and (tmp_path / "results" / "quick.csv").is_file()
