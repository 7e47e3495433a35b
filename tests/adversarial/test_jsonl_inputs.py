"""Bad JSONL task files (issue 9, item 5): refused with one line naming the file, the line and the
problem, before any model loads, with bounded memory; prompts longer than the model's context
refused; the dashboard reads only uploads and files under the data directory.

The CLI cases run the real ``kvlab`` in a subprocess on a throwaway SQLite store and measure that
process's own peak memory (VmHWM, read by the process at exit) and CPU time (``os.wait4``).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvlab.core.errors import ConfigError, HostLacksError
from kvlab.core.tasks import JsonlParams
from kvlab.dashboard.spec_form import build_spec, default_form
from kvlab.paths import DATA_DIR_VAR
from kvlab.tasks.data_dir import checked_data_file, resolve_data_path, save_upload
from kvlab.tasks.jsonl import JsonlFileMissingError, JsonlTaskError, Limits, validate_file
from tests.waiting import SAFETY_S

#: The CLI, reporting its own peak memory at exit: VmHWM of its own address space.  (``wait4``'s
#: ru_maxrss would count the pages of the forked test process before exec: a loaded model, when the
#: whole suite runs.)
KVLAB_MEASURED = """
import atexit, os, re, sys
from pathlib import Path
def _peak():
    status = Path("/proc/self/status").read_text()
    Path(os.environ["KVLAB_TEST_PEAK_FILE"]).write_text(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
atexit.register(_peak)
from kvlab.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
GOOD = {"context": "The sky is blue.", "question": "\nColour of the sky:", "answer": "blue"}
MIB = 1 << 20
#: CPU seconds: a refusal costs the imports (~2 s); loading the model costs several more. CPU time,
#: not wall time, so that other processes on a busy machine do not make the test fail.
FAST_CPU_S = 6.0


def line(**fields: object) -> str:
    return json.dumps(GOOD | fields)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    peak_rss: int  # bytes, this process's own address space
    cpu_s: float


def run_kvlab(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = SAFETY_S) -> Finished:
    """``kvlab *args`` in ``cwd`` on a throwaway store, with its own peak RSS and CPU time."""
    peak_file = cwd / "peak-kb.txt"
    environment = os.environ | {"KVLAB_DATABASE_URL": f"sqlite:///{cwd / 'kvlab.sqlite'}",
                                "KVLAB_TEST_PEAK_FILE": str(peak_file)} | (env or {})
    environment.pop("KVLAB_DEBUG", None)
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    start = time.monotonic()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-c", KVLAB_MEASURED, *args], cwd=cwd, env=environment,
                                   stdout=stdout, stderr=stderr,
                                   stdin=subprocess.DEVNULL)
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                process.kill()
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.02)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return Finished(process.returncode, out.read_text(), err.read_text(), time.monotonic() - start,
                    int(peak_file.read_text()) * 1024 if peak_file.exists() else 0, usage.ru_utime + usage.ru_stime)


def write_spec(directory: Path, path: str, **task: object) -> Path:
    fields = "".join(f"{key} = {json.dumps(value)}\n" for key, value in task.items())
    spec = directory / "spec.toml"
    spec.write_text(f'name = "jsonl-adversarial"\n[[tasks]]\nname = "jsonl"\npath = {json.dumps(path)}\n{fields}'
                    '[[configs]]\nquant = "int4"\n')
    return spec


def assert_refused(result: Finished, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr containing every fragment, no traceback, no model load."""
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    # The run prints "<name>: N configs on <model>" just before loading the model: the one line is the error.
    # (No absolute RSS bound: a child's peak RSS includes the pages of the forked test process before exec,
    # which hold a model when the whole suite runs; memory is compared between two runs instead.)
    assert result.cpu_s < FAST_CPU_S, f"{result.cpu_s:.1f} CPU s: did it load the model?"
    return lines[0]


# -- each bad file, through the real CLI ------------------------------------------------------------

BAD_FILES = {  # name: (file content, or None for no file / a directory; what the message must say)
    "broken JSON": (f"{line()}\n{{oops\n".encode(), ["bad.jsonl:2:", "not valid JSON"]),
    "missing key": (b'{"context": "c", "answer": "a"}\n', ["bad.jsonl:1:", "missing key(s) ['question']"]),
    "wrong type": (f'{line()}\n{line(answer=42)}\n'.encode(), ["bad.jsonl:2:", "'answer' must be", "got a number"]),
    "duplicate id": (f'{line(id="q1")}\n{line(id="q1")}\n'.encode(),
                     ["bad.jsonl:2:", "duplicate id 'q1' (first on line 1)"]),
    "non-UTF-8": (f"{line()}\n".encode() + b'{"context": "caf\xe9", "question": "q", "answer": "a"}\n',
                  ["bad.jsonl:2:", "not UTF-8", "0xe9"]),
    "empty file": (b"", ["bad.jsonl:", "empty"]),
    "regex that does not compile": (f'{line(answer="([unclosed", scorer="regex")}\n'.encode(),
                                    ["bad.jsonl:1:", "not a regular expression"]),
    "blank lines only": (b"\n  \n\n", ["bad.jsonl:", "no items"]),
    "directory": (None, ["bad.jsonl:", "is a directory"]),
    "no such file": (None, ["bad.jsonl:", "no such file"]),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_task_file_is_one_line_exit_2_before_any_model_loads(tmp_path, kind):
    content, fragments = BAD_FILES[kind]
    if kind == "directory":
        (tmp_path / "bad.jsonl").mkdir()
    elif content is not None:
        (tmp_path / "bad.jsonl").write_bytes(content)
    spec = write_spec(tmp_path, "bad.jsonl")
    assert_refused(run_kvlab("run", str(spec), cwd=tmp_path), "tasks.0.path:", *fragments)


def test_background_run_refuses_a_bad_file_and_stores_nothing(tmp_path):
    (tmp_path / "bad.jsonl").write_text(f"{line(id=1)}\n{line(id=1)}\n")
    spec = write_spec(tmp_path, "bad.jsonl")
    result = run_kvlab("run", str(spec), "--background", "--workers", "0", cwd=tmp_path)
    assert_refused(result, "bad.jsonl:2: duplicate id '1'")
    database = tmp_path / "kvlab.sqlite"
    if database.exists():  # else refused before the store was even opened
        with sqlite3.connect(database) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "experiments" in tables:
                assert connection.execute("SELECT count(*) FROM experiments").fetchone() == (0,)


def test_a_10_mb_line_is_refused_reading_at_most_the_line_limit(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    (small / "bad.jsonl").write_text("{oops\n")
    baseline = run_kvlab("run", str(write_spec(small, "bad.jsonl")), cwd=small)
    assert_refused(baseline, "not valid JSON")

    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / "big.jsonl").write_text(line(context="x" * (10 * MIB)) + "\n")
    result = run_kvlab("run", str(write_spec(huge, "big.jsonl")), cwd=huge)
    assert_refused(result, "big.jsonl:1:", "longer than the limit of 1 MiB", "KVLAB_MAX_JSONL_LINE_MB")
    # Only a bounded readline of 1 MiB: the 10 MB line never sits in memory (reading it whole and
    # parsing it would add some 30 MB; issue 9 saw it grow to 13 GB once tokenized).
    assert baseline.peak_rss > 10 * MIB and result.peak_rss > 10 * MIB  # both measured (python and its imports)
    grown = result.peak_rss - baseline.peak_rss
    assert grown < 8 * MIB, f"peak RSS grew by {grown / MIB:.1f} MiB reading a 10 MB line"


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    with (tmp_path / "big.jsonl").open("wb") as handle:  # sparse: 65 MiB without writing them
        handle.truncate(65 * MIB)
    assert_refused(run_kvlab("run", str(write_spec(tmp_path, "big.jsonl")), cwd=tmp_path),
                   "big.jsonl: the file is 65 MiB, over the limit of 64 MiB", "KVLAB_MAX_JSONL_MB")
    (tmp_path / "two.jsonl").write_text((line() + "\n") * 40_000)  # ~2.4 MB of valid lines
    assert_refused(run_kvlab("run", str(write_spec(tmp_path, "two.jsonl")), cwd=tmp_path,
                             env={"KVLAB_MAX_JSONL_MB": "1"}),
                   "two.jsonl: the file is", "over the limit of 1 MiB")


def test_a_bad_limit_setting_is_one_line(tmp_path):
    (tmp_path / "ok.jsonl").write_text(line() + "\n")
    assert_refused(run_kvlab("run", str(write_spec(tmp_path, "ok.jsonl")), cwd=tmp_path,
                             env={"KVLAB_MAX_JSONL_MB": "-3"}),
                   "KVLAB_MAX_JSONL_MB must be a positive number, got '-3'")


@pytest.mark.model
def test_a_prompt_longer_than_the_model_context_is_refused(tmp_path):
    from kvlab.models import DEFAULT_MODEL, pull_model

    pull_model(DEFAULT_MODEL)  # once per machine; the subprocess then loads it from the cache
    words = " ".join(["the"] * 9000)  # SmolLM2-135M: max_position_embeddings = 8192
    (tmp_path / "long.jsonl").write_text(f'{line(id="short")}\n{line(id="long", context=words)}\n')
    result = run_kvlab("run", str(write_spec(tmp_path, "long.jsonl")), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: item jsonl/long: ") and "maximum context of 8192 tokens" in last, last
    assert "evaluations in" not in result.stderr  # refused before any work


@pytest.mark.model
def test_a_backtracking_regex_answer_is_its_items_error_and_the_run_ends(tmp_path):
    """This round's probe: ``(.*.){6}XYZQ`` hung ``kvlab run`` at 100% CPU (and a worker, whose
    heartbeats stopped).  Against a model writing " 1 1 1 ...", ``( 1| 1 1)+b`` backtracks for hours:
    each of its answers is an item error after the scorer's time limit; the other rows score."""
    from kvlab.models import DEFAULT_MODEL, pull_model
    from kvlab.store import Store

    pull_model(DEFAULT_MODEL)
    ones = " ".join(["1"] * 24)
    rows = [line(id="hang", context=ones, question=" 1", answer="( 1| 1 1)+b", scorer="regex"), line(id="plain")]
    (tmp_path / "regex.jsonl").write_text("\n".join(rows) + "\n")
    result = run_kvlab("run", str(write_spec(tmp_path, "regex.jsonl", max_new_tokens=120)), cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        (experiment,) = store.list_experiments()
        assert store.get_experiment(experiment.id).status == "done", result.stderr
        by_item: dict[str, list] = {}
        for row in store.item_results(experiment.id):
            by_item.setdefault(row.item_id.removeprefix("jsonl/"), []).append(row)
    assert {item: len(rows) for item, rows in by_item.items()} == {"hang": 2, "plain": 2}
    assert all(r.score is None and "searched this output for over" in r.error for r in by_item["hang"])
    assert all(r.error is None and r.score is not None for r in by_item["plain"])


def test_f1_on_a_120000_word_answer_is_linear():
    """The probe's 120,000-word answer (under the 1 MiB line limit) cost ~190 CPU s per item-config with
    the quadratic token matching; counted, it is milliseconds (bound: 100 times that, for a busy machine)."""
    from kvlab.core.items import TaskItem
    from kvlab.tasks.scoring import answer_f1

    words = " ".join(f"w{i % 5000}" for i in range(120_000))
    item = TaskItem("jsonl", "long", "c", "q", words, 16, None, 8)
    started = time.process_time()
    assert answer_f1(item, words) == pytest.approx(1.0)
    assert answer_f1(item, "w1 w2 nothing") == pytest.approx(2 * (2 / 3) * (2 / 120_000) / (2 / 3 + 2 / 120_000))
    assert time.process_time() - started < 10.0


# -- the reader, in process: what the json module would accept but kvlab must not ---------------------

@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"context": "c", "question": "q", "answer": "a", "score": NaN}', "NaN is not JSON"),
        ('{"context": "c", "question": "q", "answer": "a", "score": 1e999}', "out of range"),
        ('{"context": "c", "question": "q", "answer": "a", "id": ' + "9" * 5000 + "}", "more than 64 digits"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"context": "c", "question": "q", "answer": "a", "answer": "b"}', "duplicate key 'answer'"),
        ('{"context": "c\\u0000", "question": "q", "answer": "a"}', "NUL character"),
        ('{"context": "\\ud800", "question": "q", "answer": "a"}', "lone surrogate"),
        ('{"context": "c", "question": "q", "answer": "a", "id": ""}', "'id' must be 1..256 printable"),
        ('{"context": "c", "question": "q", "answer": "a", "id": true}', "'id' must be a string or an integer"),
        ('{"context": "c", "question": null, "answer": "a"}', "'question' must be a string, got null"),
        ('"just a string"', "expected a JSON object, got a string"),
    ],
)
def test_values_json_accepts_but_a_task_cannot_use(tmp_path, text, message):
    path = tmp_path / "items.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(JsonlTaskError, match=f"items.jsonl:1: .*{re.escape(message)}"):
        validate_file(path)


def test_a_byte_order_mark_and_crlf_line_ends_are_fine(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + f"{line(id=1)}\r\n\r\n{line(id=2)}\r\n".encode())
    assert validate_file(path) == 2


def test_a_fifo_or_device_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # opening it would block forever
    with pytest.raises(JsonlTaskError, match="pipe.jsonl: is not a regular file"):
        validate_file(fifo)
    with pytest.raises(JsonlTaskError, match="/dev/zero: is not a regular file"):
        validate_file("/dev/zero")


def test_limits_on_lines_and_items(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text("".join(line(id=i) + "\n" for i in range(5)))
    assert validate_file(path, limits=Limits(items=5)) == 5
    path.write_text("".join(line(id=i) + "\n" for i in range(6)))
    with pytest.raises(JsonlTaskError, match=r"items.jsonl:6: more than 5 items \(set KVLAB_MAX_JSONL_ITEMS"):
        validate_file(path, limits=Limits(items=5))
    exact = line(context="x" * 100)
    path.write_text(exact + "\n")  # a line exactly at the limit (its newline not counted) is fine
    assert validate_file(path, limits=Limits(line_bytes=len(exact))) == 1
    with pytest.raises(JsonlTaskError, match="items.jsonl:1: the line is longer than the limit"):
        validate_file(path, limits=Limits(line_bytes=len(exact) - 1))


def test_a_missing_file_is_this_hosts_problem(tmp_path):
    """Another host may have the file: a worker gives the trials back instead of failing them."""
    with pytest.raises(JsonlFileMissingError, match="nope.jsonl: no such file") as raised:
        validate_file(tmp_path / "nope.jsonl")
    assert isinstance(raised.value, HostLacksError)


def test_a_path_with_a_newline_is_refused_in_the_spec():
    from kvlab.core.experiment_spec import parse_spec

    with pytest.raises(ConfigError, match="tasks.0.path: give a file path of at most 4096 printable"):
        parse_spec({"tasks": [{"name": "jsonl", "path": "a\nb.jsonl"}], "configs": [{}]})


# -- the dashboard: only the data directory -----------------------------------------------------------

@pytest.fixture
def data_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(DATA_DIR_VAR, str(root))
    return root.resolve()


def test_paths_under_the_data_directory_resolve(data_root):
    (data_root / "sub").mkdir()
    (data_root / "sub" / "a.jsonl").write_text(line() + "\n")
    assert resolve_data_path("sub/a.jsonl") == data_root / "sub" / "a.jsonl"
    assert resolve_data_path(str(data_root / "sub" / "a.jsonl")) == data_root / "sub" / "a.jsonl"
    (data_root / "alias.jsonl").symlink_to(data_root / "sub" / "a.jsonl")  # a link that stays inside
    assert checked_data_file("alias.jsonl") == str(data_root / "sub" / "a.jsonl")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/etc/passwd", "only files under the data directory"),
        ("../outside.jsonl", "'..' is not allowed"),
        ("sub/../../outside.jsonl", "'..' is not allowed"),
        ("escape.jsonl", "only files under the data directory"),  # a symlink pointing outside
        ("linked-dir/x.jsonl", "only files under the data directory"),  # through a linked directory
        ("a\x00b", "no control characters"),
        ("", "give a file under the data directory"),
    ],
)
def test_paths_outside_the_data_directory_are_refused(data_root, tmp_path, text, message):
    outside = tmp_path / "outside.jsonl"
    outside.write_text(line() + "\n")
    (data_root / "escape.jsonl").symlink_to(outside)
    (data_root / "linked-dir").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        checked_data_file(text)


def test_the_form_puts_file_errors_next_to_the_field(data_root, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text(line() + "\n")
    form = default_form()
    values = form.values | {"tasks.0.name": "jsonl", "tasks.0.path": str(outside)}
    result = build_spec(values, form.n_tasks, form.configs, form.base)
    assert result.spec is None and "only files under the data directory" in result.errors["tasks.0.path"][0]
    (data_root / "bad.jsonl").write_text(f"{line(id=1)}\n{line(id=1)}\n")
    result = build_spec(values | {"tasks.0.path": "bad.jsonl"}, form.n_tasks, form.configs, form.base)
    assert result.errors["tasks.0.path"] == ["bad.jsonl:2: duplicate id '1' (first on line 1)"]
    (data_root / "bad.jsonl").write_text(f"{line(id=1)}\n{line(id=2)}\n")  # fixed: read again (new mtime, size)
    result = build_spec(values | {"tasks.0.path": "bad.jsonl"}, form.n_tasks, form.configs, form.base)
    assert result.spec is not None and result.spec.tasks[0].params_as(JsonlParams).path == str(data_root / "bad.jsonl")


def test_uploads_are_validated_and_saved_under_the_data_directory(data_root):
    relative = save_upload("../../my items.jsonl", f"{line()}\n".encode())
    assert relative.startswith("uploads/") and relative.endswith("-my_items.jsonl")
    assert (data_root / relative).read_text() == line() + "\n"
    assert save_upload("../../my items.jsonl", f"{line()}\n".encode()) == relative  # same content, same file
    with pytest.raises(JsonlTaskError, match=r"upload bad.jsonl:1: not valid JSON"):
        save_upload("bad.jsonl", b"{oops\n")
    assert sorted(p.name for p in (data_root / "uploads").iterdir()) == [Path(relative).name]  # nothing left over


def test_the_page_accepts_an_upload_and_refuses_a_host_path(data_root, tmp_path, monkeypatch):
    from tests.dashboard.test_dashboard import NEW, assert_clean, open_page, texts

    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    at = open_page(NEW)
    at.selectbox(key="f:tasks.0.name").set_value("jsonl").run()
    at.text_input(key="f:tasks.0.path").set_value("/etc/passwd").run()
    assert_clean(at)
    assert "only files under the data directory" in texts(at.error) and "launch" not in [b.key for b in at.button]
    at.file_uploader(key="jsonl_upload_0").set_value(("bad.jsonl", b"{oops\n", "application/jsonl")).run()
    assert_clean(at)
    assert "upload bad.jsonl:1: not valid JSON" in texts(at.error)
    at.file_uploader(key="jsonl_upload_0").set_value(("items.jsonl", f"{line()}\n".encode(), "application/jsonl"))
    at.run()
    assert_clean(at)
    assert at.text_input(key="f:tasks.0.path").value.startswith("uploads/")
    assert "launch" in [b.key for b in at.button], texts(at.error)
