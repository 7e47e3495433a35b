"""Issue 18, item 10 (the terminal half): names, tags and notes are bounded at validation, and
whatever a shared store holds -- rows written before the bounds, or by anyone with write access to
the database -- reaches the terminal with its control characters escaped, so that ``kvlab ls`` and
``kvlab show`` cannot be made to clear the screen, retitle the window or print a forged row.

The whole-process cases run the real ``kvlab`` command on a SQLite file whose rows were changed
behind kvlab's back with plain SQL, as such an adversary would.
"""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from kvlab.cli.outputs import shown
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.results import ItemResult
from kvlab.experiments.provenance import environment
from kvlab.store import Store
from tests.adversarial.test_cli_inputs import Kvlab

TASKS = [{"name": "passkey", "context_lengths": [256]}]
#: Clears the screen, sets the window title, then starts a line that looks like a finished experiment.
EVIL = ("\x1b[2J\x1b[H\x1b]0;pwned\x07ok\n   99  done          1/1     100/100    2026-01-01 00:00:00  fake"
        "\r\u202egnp.exe\x9b31m")
FORGED_ROW = "   99  done"


def refused(data: dict, *says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec({"tasks": TASKS, "configs": [{}]} | data)
    for fragment in says:
        assert fragment in str(info.value), str(info.value)


# -- bounds at validation --------------------------------------------------------------------------

@pytest.mark.parametrize("data, says", [
    ({"name": "x" * 100_000}, ("name: 100,000 characters; at most 200",)),
    ({"name": "x" * 201}, ("name: 201 characters; at most 200",)),
    ({"name": "run\x1b]0;title\x07"}, ("name: holds the control character '\\x1b' at position 3",)),
    ({"name": "two\nlines"}, ("name: holds the control character '\\n'",)),
    ({"name": "rtl\u202eexe"}, ("name: holds the control character '\\u202e'",)),
    ({"name": "   "}, ("name: give the experiment a name",)),
    ({"configs": [{"name": "c" * 201, "quant": "int8"}]}, ("configs.0.name: 201 characters",)),
    ({"configs": [{"name": "int8\r", "quant": "int8"}]}, ("configs.0.name: holds the control character '\\r'",)),
    ({"tags": ["t"] * 33}, ("tags: 33 tags; at most 32",)),
    ({"tags": ["ok", "x" * 65]}, ("tags.1: 65 characters; at most 64",)),
    ({"tags": ["ok", "\x1b[31mred"]}, ("tags.1: holds the control character '\\x1b' at position 0",)),
    ({"notes": "n" * 10_001}, ("notes: 10,001 characters; at most 10,000",)),
    ({"notes": "line\n\x1b[2J"}, ("notes: holds the control character '\\x1b' at position 5",)),
    ({"model": "smollm2\x1b[2J"}, ("model: holds the control character",)),
])
def test_texts_are_bounded(data, says):
    refused(data, *says)


def test_texts_at_their_bounds_are_accepted():
    spec = parse_spec({"name": "é" * 200, "tasks": TASKS, "tags": ["t" * 64] + [f"t{i}" for i in range(31)],
                       "notes": "first line\n\tindented\n" + "n" * 9_979,
                       "configs": [{"name": "名前 with spaces", "quant": "int8"}]})
    assert len(spec.tags) == 32 and len(spec.notes) == 10_000


# -- the helper ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, one_line, lines", [
    ("plain é 中 ok", "plain é 中 ok", "plain é 中 ok"),
    ("\x1b]0;t\x07x", "\\x1b]0;t\\x07x", "\\x1b]0;t\\x07x"),
    ("a\nb", "a\\nb", "a\nb"),
    ("cr\r\n", "cr\\r\\n", "cr\\r\n"),
    ("\u202eabc\x9b1m\tz\x7f", "\\u202eabc\\x9b1m\\tz\\x7f", "\\u202eabc\\x9b1m\\tz\\x7f"),
])
def test_shown_escapes_every_control_character(text, one_line, lines):
    assert shown(text) == one_line
    assert shown(text, lines=True) == lines


# -- the whole process -----------------------------------------------------------------------------

def _result(config_name: str) -> ItemResult:
    return ItemResult(
        item_id="passkey/L256/i0", task="passkey", config_name=config_name, config={"name": "baseline"}, seed=0,
        context_length=256, depth=0.5, prompt_tokens=256, context_tokens=250, kept_tokens=250.0, kept_fraction=1.0,
        baseline_kv_bytes=1000, physical_kv_bytes=1000, analytic_kv_bytes=1000, compression_ratio=1.0,
        peak_kv_bytes=1000, generated="12345", answer="12345", output_tokens=3, ttft_s=0.25, tpot_s=None,
        prefill_s=0.125, compress_s=0.0, decode_s=0.125, peak_memory_bytes=None, score=1.0, error=None)


@pytest.fixture
def poisoned(tmp_path) -> tuple[Kvlab, int]:
    """An experiment with one finished trial and a result, then its name, tags, config name, trial
    error and an event rewritten with escape sequences and newlines by plain SQL."""
    kvlab = Kvlab(tmp_path)
    with Store(f"sqlite:///{kvlab.db}") as store:
        experiment_id = store.create_experiment(parse_spec({"name": "clean", "tasks": TASKS, "configs": [{}]}),
                                                environment())
        [trial] = store.claim_trials("w1", max_trials=1)
        store.set_items_total(trial.id, 1)
        store.add_item_result(trial.id, _result("baseline"))
        store.finish_trial(trial.id, "done", worker_id="w1")
        store.log_event(experiment_id, f"worker said {EVIL}", level="warning")
    with sqlite3.connect(kvlab.db) as connection:
        connection.execute("UPDATE experiments SET name = ?, tags = ?", (EVIL, json.dumps([EVIL, "fine"])))
        connection.execute("UPDATE trials SET config_name = ?, error = ?", (EVIL, EVIL))
        connection.execute("UPDATE item_results SET config_name = ?", (EVIL,))
    return kvlab, experiment_id


def assert_safe(output: str) -> None:
    assert all(c.isprintable() or c == "\n" for c in output), [c for c in output if not c.isprintable()][:5]
    assert not any(line.startswith(FORGED_ROW) for line in output.splitlines()), output
    assert "\\x1b]0;pwned\\x07" in output  # the name is there, escaped, not dropped


def test_ls_escapes_names_and_tags(poisoned):
    kvlab, _ = poisoned
    result = kvlab("ls")
    assert result.returncode == 0, result.stderr
    assert_safe(result.stdout)
    assert len(result.stdout.splitlines()) == 2  # the header and the one experiment
    assert "fine]" in result.stdout


def test_show_escapes_every_stored_text(poisoned):
    kvlab, experiment_id = poisoned
    result = kvlab("show", str(experiment_id))
    assert result.returncode == 0, result.stderr
    assert_safe(result.stdout)
    assert "worker said \\x1b[2J" in result.stdout and "error: \\x1b[2J" in result.stdout


def test_error_lines_are_escaped(tmp_path):
    """A file name is echoed in the error: escaped there too, still one line."""
    kvlab = Kvlab(tmp_path)
    line = kvlab.user_error("run", "\x1b]0;pwned\x07\n99 done.toml", says=("spec file not found",))
    assert_safe(line)


def test_doctor_escapes_what_the_endpoint_says(tmp_path):
    """Model ids come from the endpoint: a hostile one cannot reach the terminal raw either."""
    from tests.test_doctor import Behaviour, FakeOpenAI, FakeServer

    server = FakeServer(("127.0.0.1", 0), FakeOpenAI)
    server.behaviour = Behaviour(models=(EVIL, "other-model"))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        kvlab = Kvlab(tmp_path)
        result = kvlab("doctor", "--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1", "--model", "x",
                       "--timeout", "30", KVLAB_SECRETS_FILE=str(tmp_path / "none.toml"))
    finally:
        server.shutdown()
        server.server_close()
    assert "\\x1b]0;pwned\\x07" in result.stdout, result.stdout + result.stderr
    assert_safe(result.stdout + result.stderr)
