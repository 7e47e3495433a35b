"""The store commands and ``--help`` start in well under a second: they never import the heavy libraries.

Each command runs in a fresh interpreter (a real subprocess, as a user runs it) against a SQLite store
holding two synthetic experiments, then prints the modules it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from scipy import stats

from kvlab.analysis.decision import normal_isf, normal_sf
from kvlab.analysis.summary import binomial_two_sided_half
from kvlab.store import Store
from tests.dashboard_data import populate
from tests.waiting import SAFETY_S

HEAVY = ("torch", "transformers", "kvpress", "scipy", "streamlit", "ray")
MARK = "LOADED-MODULES "
SCRIPT = f"""
import json, sys
from kvlab.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:  # --help
    status = exit.code
print("\\n{MARK}" + json.dumps({{"status": status, "modules": sorted(sys.modules)}}))
"""


@pytest.fixture(scope="module")
def store_env(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli-imports")
    url = f"sqlite:///{root / 'kvlab.sqlite'}"
    with Store(url) as store:
        populate(store)  # 1: finished
        populate(store, "running-sweep", finish=False)  # 2: running, for `kvlab cancel`
    return {**os.environ, "KVLAB_DATABASE_URL": url, "KVLAB_HOME": str(root / "home")}


def loaded_modules(argv: list[str], env: dict[str, str]) -> list[str]:
    """The modules ``kvlab ARGV`` had loaded when it returned; asserts it succeeded."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, *argv], env=env, capture_output=True, text=True,
                          timeout=SAFETY_S)
    line = next(line for line in done.stdout.splitlines() if line.startswith(MARK))
    report = json.loads(line.removeprefix(MARK))
    assert report["status"] in (0, None), f"kvlab {' '.join(argv)}: {done.stderr}"
    return report["modules"]


@pytest.mark.parametrize("argv", [["--help"], ["ls"], ["show", "1"], ["export", "1", "--format", "csv"],
                                  ["export", "1", "--format", "json"], ["db", "status"], ["cancel", "2"],
                                  ["rerun", "1", "--workers", "0"]], ids=" ".join)
def test_store_commands_import_no_heavy_library(argv, store_env):
    modules = loaded_modules(argv, store_env)
    assert "kvlab.cli.main" in modules  # the command ran in this interpreter
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"kvlab {' '.join(argv)} imported {heavy[:8]}"


@pytest.mark.parametrize("argv", [["ls"], ["ls", "--status", "done"], ["db", "status"], ["compare", "1", "2"]],
                         ids=" ".join)
def test_listing_commands_import_neither_the_spec_models_nor_another_commands_parser(argv, store_env):
    """They read rows: no pydantic (the spec's models), and only the store commands' parsers (build_parser)."""
    modules = loaded_modules(argv, store_env)
    assert "pydantic" not in modules and "kvlab.core.experiment_spec" not in modules
    assert {"kvlab.cli.run", "kvlab.cli.serve", "kvlab.cli.tune"}.isdisjoint(modules)


def test_help_lists_every_command_of_every_module():
    from kvlab.cli.main import COMMAND_PARSERS, build_parser

    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "--help"], capture_output=True, text=True,
                          timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr
    commands = [name for names in COMMAND_PARSERS.values() for name in names]
    listed = build_parser()._subparsers._group_actions[0].choices  # every module's parsers
    assert list(listed) == commands and all(name in done.stdout for name in commands)
    assert tuple(build_parser("ls")._subparsers._group_actions[0].choices) == COMMAND_PARSERS[
        "kvlab.cli.store:add_store_commands"]


def test_show_prints_intervals_without_scipy(store_env):
    """`kvlab show` of a finished experiment computes its summary (intervals, tests, sweet spot) with
    the standard library alone."""
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "show", "1"], env=store_env, capture_output=True,
                          text=True, timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr
    assert "sweet spot" in done.stdout.lower() and "int4" in done.stdout


def test_standard_library_statistics_match_scipy():
    for z in (0.0, 0.5, 1.96, 4.0, 8.5, 12.0):
        assert normal_sf(z) == pytest.approx(stats.norm.sf(z), rel=1e-9, abs=0)
    for q in (0.5, 0.025, 0.025 / 7, 1e-6, 1e-12):
        assert normal_isf(q) == pytest.approx(stats.norm.isf(q), rel=1e-9, abs=1e-12)
    for n in range(0, 61):
        for k in range(n + 1):
            expected = stats.binomtest(k, n, 0.5).pvalue if n else 1.0
            assert binomial_two_sided_half(k, n) == pytest.approx(expected, rel=1e-9, abs=1e-15), (k, n)
