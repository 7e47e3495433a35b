"""Issue 9, item 4: a password in a base URL never leaks, and requests carry the key, not the URL's password.

Real processes throughout: the ``kvlab`` CLI as subprocesses (``run --background`` with a launched
worker, ``show``, ``export``, ``ls``, ``doctor``) on a SQLite file in a temporary directory, against a
real HTTP server on 127.0.0.1 that wants the API key as a Bearer token, records every
``Authorization`` header and -- as careless servers do -- echoes the URL's password and the key in
its error messages.  Afterwards the password (and the key) is searched for, as raw bytes, in every
file the run left behind (the database, its ``-wal`` -- kept from being folded away by a connection
the test holds open -- and ``-shm``, the exports, the worker logs, kvlab's error logs) and in
everything the commands printed: it must appear nowhere.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from kvlab.models import DEFAULT_MODEL, pull_model
from kvlab.paths import models_root
from tests.waiting import SAFETY_S

PASSWORD = f"s3cr3t-{uuid.uuid4().hex}"
KEY = f"sk-kvlab-{uuid.uuid4().hex}"
USER = "kvuser"
ECHO = f"refused (user {USER}, password {PASSWORD}, key {KEY}, url http://{USER}:{PASSWORD}@gateway:8000/v1)"
MODELS = {"echo-400": 400, "echo-500": 500}  # the completion status each served model answers with

SPEC = """\
name = "{name}"
model = "{model}"

[backend]
kind = "openai_compat"
model_id = "{model_id}"
max_retries = 0
request_timeout_s = 20
{base_url}
[[tasks]]
name = "passkey"
context_lengths = [128]
depths = [0.5]
num_items = 2
max_new_tokens = 4

[[configs]]
name = "baseline"
"""


@dataclass
class Seen:
    """What the server received: ``(request line, Authorization header or None)``."""

    requests: list[tuple[str, str | None]] = field(default_factory=list)


class EchoingEndpoint(BaseHTTPRequestHandler):
    """OpenAI-compatible enough for kvlab: ``GET /v1/models``; ``POST /v1/completions`` fails with
    the status of the model asked for, its message echoing the password and the key."""

    server: EchoingServer

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.answer()

    def answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization")
        self.server.seen.requests.append((f"{self.command} {self.path}", auth))
        if auth != f"Bearer {KEY}":
            self.reply(401, {"error": {"message": f"Incorrect API key provided: {auth}"}})
        elif self.command == "GET" and self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": model, "object": "model"} for model in MODELS]})
        elif self.command == "POST" and self.path in ("/v1/completions", "/v1/chat/completions"):
            model = json.loads(body or b"{}").get("model")
            self.reply(MODELS.get(model, 404), {"error": {"message": ECHO, "type": "invalid_request_error"}})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}"}})

    def reply(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class EchoingServer(ThreadingHTTPServer):
    seen: Seen


@pytest.fixture
def endpoint() -> Iterator[EchoingServer]:
    server = EchoingServer(("127.0.0.1", 0), EchoingEndpoint)
    server.seen = Seen()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@dataclass
class Lab:
    """A private kvlab installation in ``root``: its database, logs and home, and the CLI run there."""

    root: Path
    env: dict[str, str]
    outputs: list[str] = field(default_factory=list)
    readers: list[sqlite3.Connection] = field(default_factory=list)

    @property
    def database_url(self) -> str:
        return self.env["KVLAB_DATABASE_URL"]

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "kvlab.cli", *args], cwd=self.root / "work",
                              env=env or self.env, capture_output=True, text=True, timeout=SAFETY_S)
        self.outputs += [done.stdout, done.stderr]
        return done

    def hold_wal(self) -> Path:
        """Keep a connection open, so that the WAL file stays as written: the last kvlab process to
        close the database would otherwise fold it into the main file and delete it before the search."""
        reader = sqlite3.connect(self.root / "db" / "kvlab.sqlite")
        reader.execute("SELECT count(*) FROM experiments").fetchone()
        self.readers.append(reader)
        return self.root / "db" / "kvlab.sqlite-wal"

    def spec(self, name: str, model_id: str = "echo-400", base_url: str = "", model: str = DEFAULT_MODEL) -> Path:
        """A spec file, outside the searched directories (it holds what the user wrote)."""
        path = self.root / "inputs" / f"{name}.toml"
        base_url = f'base_url = "{base_url}"\n' if base_url else ""
        path.write_text(SPEC.format(name=name, model=model, model_id=model_id, base_url=base_url))
        return path

    def leaks(self, secret: str) -> list[str]:
        """Every file under the lab (but its inputs) and every captured output holding ``secret``."""
        needle = secret.encode()
        hits = []
        for directory, subdirectories, files in os.walk(self.root):  # symlinks (the shared models) not followed
            subdirectories[:] = [d for d in subdirectories if Path(directory, d) != self.root / "inputs"]
            hits += [str(Path(directory, name)) for name in files if needle in Path(directory, name).read_bytes()]
        hits += [f"output {index}" for index, text in enumerate(self.outputs) if secret in text]
        return hits


@pytest.fixture
def lab(tmp_path: Path, endpoint: EchoingServer) -> Iterator[Lab]:
    pull_model(DEFAULT_MODEL)  # a no-op once setup pulled it; the tokenizer sizes the prompts
    for name in ("inputs", "work", "db", "logs", "home"):
        (tmp_path / name).mkdir()
    (tmp_path / "home" / "models").symlink_to(models_root(), target_is_directory=True)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("KVLAB_") and not name.lower().endswith("_proxy")}
    env |= {"KVLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'db' / 'kvlab.sqlite'}",
            "KVLAB_LOG_DIR": str(tmp_path / "logs"), "KVLAB_HOME": str(tmp_path / "home"),
            "KVLAB_SECRETS_FILE": str(tmp_path / "inputs" / "no-secrets.toml"),
            "KVLAB_BASE_URL": f"http://{USER}:{PASSWORD}@127.0.0.1:{endpoint.server_address[1]}/v1",
            "KVLAB_API_KEY": KEY, "NO_PROXY": "*"}
    lab = Lab(tmp_path, env)
    yield lab
    for reader in lab.readers:
        reader.close()
    for worker in local_workers(env["KVLAB_DATABASE_URL"]):  # only on failure: a worker this test started
        worker.kill()


def local_workers(database_url: str) -> list[psutil.Process]:
    """The ``kvlab worker`` processes working on ``database_url`` (the launcher detaches them)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if "kvlab.cli" in command and "worker" in command:
            try:
                if process.environ().get("KVLAB_DATABASE_URL") == database_url:
                    found.append(process)
            except psutil.Error:
                continue
    return found


def test_a_url_password_in_a_spec_is_refused_before_anything_is_stored(lab: Lab):
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:9/v1"
    seed_style = lab.root / "inputs" / "seed.toml"
    seed_style.write_text(f'[server]\nbase_url = "{url}"\nmodel_id = "echo-400"\n\n[kv_cache]\ndtype = "int8"\n\n'
                          '[[tasks]]\nname = "passkey"\ncontext_lengths = [128]\n')
    native = lab.spec("native", base_url=url)
    for args, field_name in (([str(native)], "backend.base_url"),
                             ([str(native), "--background"], "backend.base_url"),
                             ([str(seed_style), "--background"], "backend.base_url"),
                             ([str(lab.spec("in-model", model=f"https://{USER}:{PASSWORD}@hub.example/m")),
                               "--background"], "model")):
        done = lab.cli("run", *args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and field_name in lines[0], done.stderr
    assert "no experiments yet" in lab.cli("ls").stdout
    assert lab.leaks(PASSWORD) == []


@pytest.mark.server
def test_a_url_password_never_leaks_and_requests_carry_the_key(lab: Lab, endpoint: EchoingServer):
    # Two experiments from KVLAB_BASE_URL (user:password inside): one whose items the server refuses
    # (HTTP 400: item errors), one whose endpoint fails (HTTP 500: the batch's error, events, worker log).
    assert lab.cli("run", str(lab.spec("refused-items", "echo-400")), "--background", "--workers", "0").returncode == 0
    wal = lab.hold_wal()
    queued = lab.cli("run", str(lab.spec("broken-endpoint", "echo-500")), "--background", "--workers", "1")
    assert queued.returncode == 0, queued.stderr
    workers = local_workers(lab.database_url)
    assert len(workers) == 1
    _, alive = psutil.wait_procs(workers, timeout=SAFETY_S)
    assert not alive, f"the worker did not finish within {SAFETY_S:.0f} s"

    requests = list(endpoint.seen.requests)
    assert any(line.startswith("POST /v1/completions") for line, _ in requests), requests
    assert {auth for _, auth in requests} == {f"Bearer {KEY}"}, "a request did not carry the key as a Bearer token"

    exports = lab.root / "exports"
    exports.mkdir()
    for experiment_id in ("1", "2"):
        assert lab.cli("show", experiment_id).returncode == 0
        for fmt in ("json", "csv"):
            out = exports / f"{experiment_id}.{fmt}"
            done = lab.cli("export", experiment_id, "--format", fmt, "--out", str(out))
            assert done.returncode == 0, done.stderr
    assert lab.cli("ls").returncode == 0

    # The server's echo was stored, masked: the test went through the paths that leaked.
    document = json.loads((exports / "1.json").read_text())
    errors = [result["error"] for result in document["results"]]
    assert errors and all("password ***" in error and "http://***@gateway" in error for error in errors), errors
    assert "password ***" in (exports / "1.csv").read_text()
    events = json.loads((exports / "2.json").read_text())["events"]
    assert any("password ***" in event["message"] for event in events), events
    assert any((lab.root / "logs").iterdir()), "the launched worker wrote no log"

    # The doctor, given the same URL: the user:password is named as what it is, not blamed on the key.
    endpoint.seen.requests.clear()
    doctor = lab.cli("doctor", "--model", "echo-400")
    assert doctor.returncode != 0  # the completion fails (HTTP 400), everything before it passes
    assert "holds a user:password, which kvlab never sends" in doctor.stdout, doctor.stdout
    assert "the server accepts the key" in doctor.stdout and "password ***" in doctor.stdout, doctor.stdout
    assert {auth for _, auth in endpoint.seen.requests} == {f"Bearer {KEY}"}
    endpoint.seen.requests.clear()
    no_key = lab.cli("doctor", "--model", "echo-400", env={k: v for k, v in lab.env.items() if k != "KVLAB_API_KEY"})
    assert no_key.returncode != 0
    assert "KVLAB_API_KEY is not set" in no_key.stdout, no_key.stdout
    assert "in the base URL was not sent" in no_key.stdout, no_key.stdout
    assert [auth for _, auth in endpoint.seen.requests] == [None], "the URL's user:password was sent"

    assert wal.stat().st_size > 0
    assert lab.leaks(PASSWORD) == []
    assert lab.leaks(KEY) == []


def test_a_password_an_older_kvlab_stored_is_redacted_on_the_way_out(lab: Lab):
    """``kvlab show`` and ``kvlab export`` redact what a database written before this fix may hold
    (here without the password in the environment: the URL's form alone gives it away)."""
    env = {name: value for name, value in lab.env.items() if name != "KVLAB_BASE_URL"}
    assert lab.cli("run", str(lab.spec("legacy")), "--background", "--workers", "0", env=env).returncode == 0
    stored = f"http://{USER}:{PASSWORD}@old-gateway:8000/v1"
    with closing(sqlite3.connect(lab.root / "db" / "kvlab.sqlite")) as db, db:
        db.execute("UPDATE trials SET error = ?", (f"{stored} refused the key",))
        db.execute("INSERT INTO events (experiment_id, ts, level, message) VALUES (1, 0, 'error', ?)",
                   (f"endpoint {stored} failed",))
        db.execute("UPDATE experiments SET spec = json_set(spec, '$.backend.base_url', ?)", (stored,))
    shown = lab.cli("show", "1", env=env)
    exported = lab.cli("export", "1", "--format", "json", env=env)
    assert shown.returncode == 0 and exported.returncode == 0, shown.stderr + exported.stderr
    assert "http://***@old-gateway:8000/v1 refused the key" in shown.stdout, shown.stdout
    document = json.loads(exported.stdout)
    assert document["experiment"]["spec"]["backend"]["base_url"] == "http://***@old-gateway:8000/v1"
    assert [PASSWORD in text for text in lab.outputs] == [False] * len(lab.outputs)
