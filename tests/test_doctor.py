"""``kvlab doctor`` against real local servers (``ThreadingHTTPServer`` on 127.0.0.1, port 0), each
misbehaving in one way, through the function, the CLI and the dashboard page."""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvlab.cli.main import main
from kvlab.core.errors import ConfigError
from kvlab.dashboard import page_table
from kvlab.doctor import CHECK_NAMES, DoctorReport, diagnose
from kvlab.engines.endpoint_rules import choose_model, error_message
from kvlab.engines.factory import openai_endpoint
from tests.waiting import SAFETY_S

PAGE = str(Path(__file__).resolve().parent.parent / page_table.DOCTOR.script)
KEY = "sk-kvlab-test-0123456789-right"
WRONG_KEY = "sk-kvlab-test-9876543210-wrong"
HTML = b"<!doctype html><html><head><title>Sign in - Gateway</title></head><body>Please sign in</body></html>"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")

Reply = tuple[int, str, bytes]


@dataclass
class Behaviour:
    """How the fake server answers: an OpenAI API under ``prefix``, unless told otherwise."""

    prefix: str = "/v1"
    key: str | None = None
    models: tuple[str, ...] = ("tiny-model", "other-model")
    owned_by: str | None = None
    completion: Reply | None = None  # both completion routes answer this
    everything: Reply | None = None  # every request answers this
    delay_s: float = 0.0
    chat_only: bool = False  # POST /completions is 404
    seen: list[str] = field(default_factory=list)
    authorization: list[str] = field(default_factory=list)  # each request's Authorization header ("" for none)


def json_reply(body: object, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(body).encode()


class FakeOpenAI(BaseHTTPRequestHandler):
    server: FakeServer

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.answer()

    def answer(self) -> None:
        behaviour = self.server.behaviour
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        behaviour.seen.append(f"{self.command} {self.path}")
        behaviour.authorization.append(self.headers.get("Authorization") or "")
        time.sleep(behaviour.delay_s)
        status, content_type, body = self.route(behaviour)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def route(self, behaviour: Behaviour) -> Reply:
        if behaviour.everything:
            return behaviour.everything
        if not self.path.startswith(behaviour.prefix + "/"):
            return json_reply({"detail": "Not Found"}, 404)
        if behaviour.key and self.headers.get("Authorization") != f"Bearer {behaviour.key}":
            sent = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            return json_reply({"error": {"message": f"Incorrect API key provided: {sent}"}}, 401)
        endpoint = self.path.removeprefix(behaviour.prefix)
        if endpoint == "/models" and self.command == "GET":
            owner = {"owned_by": behaviour.owned_by} if behaviour.owned_by else {}
            return json_reply({"object": "list",
                               "data": [{"id": m, "object": "model"} | owner for m in behaviour.models]})
        if endpoint == "/completions" and behaviour.chat_only:
            return json_reply({"detail": "Not Found"}, 404)
        if endpoint in ("/completions", "/chat/completions") and self.command == "POST":
            return behaviour.completion or json_reply({"choices": [{"index": 0, "text": " world"}]})
        return json_reply({"detail": "Not Found"}, 404)

    def log_message(self, *args: object) -> None:
        pass


class FakeServer(ThreadingHTTPServer):
    behaviour: Behaviour

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that time out or refuse the TLS handshake hang up: that is the point


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No proxy, key or endpoint from the machine's environment or secrets file."""
    for var in PROXY_VARS + ("KVLAB_API_KEY", "KVLAB_BASE_URL", "KVLAB_MODEL_ID"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)
    monkeypatch.setenv("KVLAB_SECRETS_FILE", str(tmp_path / "no-secrets.toml"))


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """Start a fake server; returns its origin (``http://127.0.0.1:PORT``, https with ``tls``)."""
    servers: list[FakeServer] = []

    def start(behaviour: Behaviour | None = None, tls: ssl.SSLContext | None = None) -> str:
        server = FakeServer(("127.0.0.1", 0), FakeOpenAI)
        server.behaviour = behaviour or Behaviour()
        if tls:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def statuses(report: DoctorReport) -> dict[str, str]:
    return {check.name: check.status for check in report.checks}


def check(report: DoctorReport, name: str):
    return next(c for c in report.checks if c.name == name)


def assert_ok(report: DoctorReport) -> None:
    assert report.ok, report.to_text()
    assert all(c.status == "ok" for c in report.checks), report.to_text()


def test_healthy_server_passes_every_check(serve):
    behaviour = Behaviour(key=KEY)
    report = diagnose(serve(behaviour) + "/v1", "tiny-model", KEY, timeout_s=2, key_source="environment variable X")
    assert_ok(report)
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert "POST /v1/completions" in behaviour.seen
    assert KEY not in report.to_text() and "****" in report.to_text()


def test_401_without_key_names_the_variable(serve):
    report = diagnose(serve(Behaviour(key=KEY)) + "/v1", "tiny-model", None, timeout_s=2, key_var="MY_KEY")
    auth = check(report, "auth")
    assert auth.status == "fail" and "none is set" in auth.detail and "MY_KEY" in auth.detail
    assert "set MY_KEY" in auth.fix and ".streamlit/secrets.toml" in auth.fix
    assert statuses(report)["models"] == statuses(report)["completion"] == "skip"


@pytest.mark.parametrize("accepted", [True, False])
def test_whitespace_around_the_key_says_strip_it(serve, accepted):
    report = diagnose(serve(Behaviour(key=KEY if accepted else "another-key-entirely")) + "/v1", "tiny-model",
                      f"  {KEY}\n", timeout_s=2, key_source="environment variable KVLAB_API_KEY")
    auth = check(report, "auth")
    assert "whitespace" in auth.detail and auth.fix.startswith("strip it")
    if accepted:  # kvlab strips keys itself, so a run works: a warning, for the other clients
        assert auth.status == "warn" and "the stripped key works" in auth.detail
        assert statuses(report)["completion"] == "ok" and report.ok
    else:
        assert auth.status == "fail" and "rejects the stripped key too" in auth.detail
    assert KEY not in report.to_text()


def test_wrong_key_is_rejected_and_never_shown(serve):
    report = diagnose(serve(Behaviour(key=KEY)) + "/v1", "tiny-model", WRONG_KEY, timeout_s=2,
                      key_source="environment variable KVLAB_API_KEY")
    auth = check(report, "auth")
    assert auth.status == "fail" and "rejects the key" in auth.detail and "HTTP 401" in auth.detail
    assert "KVLAB_API_KEY" in auth.fix
    assert WRONG_KEY not in report.to_text()  # the server echoed it; the report masks it
    assert "****" in auth.detail


@pytest.mark.parametrize("key", [KEY, None])
def test_a_user_password_in_the_url_is_named_not_blamed_on_the_key(serve, key):
    """The URL's user:password is never sent (httpx would send it as Basic auth instead of the key):
    with the key the server accepts, everything passes but a warning; without one, the auth failure
    says that the URL's password did not count."""
    origin = serve(Behaviour(key=KEY))
    report = diagnose(origin.replace("http://", "http://bob:pa55w0rd-in-url@") + "/v1", "tiny-model", key,
                      timeout_s=2, key_source="environment variable KVLAB_API_KEY")
    base = check(report, "base URL")
    assert base.status == "warn" and "holds a user:password, which kvlab never sends" in base.detail
    assert "http://***@127.0.0.1" in base.detail and "put the key in KVLAB_API_KEY" in base.fix
    auth = check(report, "auth")
    if key:
        assert auth.status == "ok" and statuses(report)["completion"] == "ok" and report.ok
    else:
        assert auth.status == "fail" and "none is set" in auth.detail and "base URL was not sent" in auth.detail
    assert "pa55w0rd-in-url" not in report.to_text() and report.base_url == origin + "/v1"


def test_an_echoed_key_cut_short_by_the_report_leaves_no_piece_behind(serve):
    """Details are cut at 200 characters: a key across the cut must be masked before, not after."""
    echo = "x" * 180 + f" got key {KEY} and url http://bob:pa55w0rd-in-url@gw/v1"
    behaviour = Behaviour(key=KEY, completion=json_reply({"error": {"message": echo}}, 400))
    report = diagnose(serve(behaviour) + "/v1", "tiny-model", KEY, timeout_s=2, key_source="environment variable X")
    assert check(report, "completion").status == "fail"
    assert KEY[:8] not in report.to_text() and "pa55w0rd" not in report.to_text()


def test_dead_local_proxy(serve, monkeypatch):
    base = serve() + "/v1"
    port = closed_port()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    report = diagnose(base, "tiny-model", None, timeout_s=2)
    proxy = check(report, "proxy")
    assert proxy.status == "fail" and "local proxy failed" in proxy.detail and "HTTP_PROXY" in proxy.detail
    assert "unset HTTP_PROXY" in proxy.fix and "NO_PROXY" in proxy.fix
    assert statuses(report)["connection"] == "skip"
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the fix works
    assert_ok(diagnose(base, "tiny-model", None, timeout_s=2))


@pytest.mark.parametrize("path, problem", [("/v1/v1", "/v1 appears twice"),
                                           ("/v1/chat/completions", "endpoint path /chat/completions"),
                                           ("/v1/completions/", "endpoint path /completions")])
def test_base_url_with_too_much_path(serve, path, problem):
    origin = serve()
    report = diagnose(origin + path, "tiny-model", None, timeout_s=2)
    base_check = check(report, "base URL")
    assert base_check.status == "fail" and problem in base_check.detail
    assert base_check.fix == f"use {origin}/v1 as the base URL"
    assert all(c.status == "ok" for c in report.checks[1:]), report.to_text()  # the rest, against the fixed URL


def test_missing_v1(serve):
    origin = serve()
    report = diagnose(origin, "tiny-model", None, timeout_s=2)
    base_check = check(report, "base URL")
    assert base_check.status == "fail" and "add /v1" in base_check.detail and f"{origin}/v1" in base_check.fix
    assert all(c.status == "ok" for c in report.checks[1:]), report.to_text()


def test_missing_scheme_stops_everything():
    report = diagnose("127.0.0.1:8000/v1", "tiny-model", None, timeout_s=1)
    base_check = check(report, "base URL")
    assert base_check.status == "fail" and "no scheme" in base_check.detail
    assert "http://127.0.0.1:8000/v1" in base_check.fix
    assert all(c.status == "skip" for c in report.checks[1:])


@pytest.mark.parametrize("text", ["not a url at all", "host:port", "http//:x y"])
def test_text_that_is_no_url_is_said_so_with_an_example(text):
    """Not "write it as http://not a url at all": a scheme would not make it a URL."""
    base_check = check(diagnose(text, None, None, timeout_s=1), "base URL")
    assert base_check.status == "fail" and base_check.detail == f"{text} is not a URL"
    assert "for example http://127.0.0.1:8000/v1" in base_check.fix and f"http://{text}" not in base_check.fix


def test_the_page_draws_its_statuses_without_an_emoji_font():
    """Problems carry Material icons (Streamlit ships the font); the table says each status in words."""
    at = AppTest.from_file(PAGE, default_timeout=SAFETY_S).run()
    at.text_input(key="doctor_base_url").input("not a url at all")
    at.button(key="doctor_check").click().run()
    assert not at.exception
    assert [e.icon for e in at.error] == [":material/error:", ":material/error:"]  # the summary, the base URL
    table = at.dataframe[0].value
    assert list(table.columns) == ["Check", "Status", "Result", "Fix"]
    assert list(table["Status"]) == ["FAIL", *["skip"] * (len(CHECK_NAMES) - 1)]
    emoji = re.compile("[\U0001F000-\U0001FFFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F]")
    assert not emoji.search(page_text(at) + table.to_csv())


def test_wrong_model_lists_the_servers_models(serve):
    report = diagnose(serve() + "/v1", "tiny-modle", None, timeout_s=2)
    models = check(report, "models")
    assert models.status == "fail" and "tiny-model, other-model" in models.detail
    assert "did you mean tiny-model" in models.detail
    assert "KVLAB_MODEL_ID" in models.fix and statuses(report)["completion"] == "skip"


@pytest.mark.parametrize("served", [("tiny-model", "other-model"), ("tiny-model",)])
def test_no_model_id_lists_models_and_tries_the_first(serve, served):
    """As the openai_compat engine: the only model is used, several are an error."""
    report = diagnose(serve(Behaviour(models=served)) + "/v1", None, None, timeout_s=2)
    models = check(report, "models")
    assert models.status == ("fail" if len(served) > 1 else "warn") and ", ".join(served) in models.detail
    assert "KVLAB_MODEL_ID" in models.fix and "backend.model_id" in models.fix
    assert statuses(report)["completion"] == "ok" and report.ok == (len(served) == 1)


def test_chat_only_server(serve):
    completion = check(diagnose(serve(Behaviour(chat_only=True)) + "/v1", "tiny-model", None, timeout_s=2),
                       "completion")
    assert completion.status == "fail" and "chat-only" in completion.detail and "/v1/completions" in completion.fix


def test_200_with_an_error_body_and_no_choices(serve):
    error = json_reply({"error": {"message": "model tiny-model is not loaded yet", "type": "server_error"}})
    report = diagnose(serve(Behaviour(completion=error)) + "/v1", "tiny-model", None, timeout_s=2)
    completion = check(report, "completion")
    assert completion.status == "fail" and "HTTP 200 with an error and no choices" in completion.detail
    assert "model tiny-model is not loaded yet" in completion.detail and completion.fix


@pytest.mark.parametrize("everywhere", [False, True])
def test_html_page(serve, everywhere):
    page = (200, "text/html; charset=utf-8", HTML)
    behaviour = Behaviour(everything=page) if everywhere else Behaviour(completion=page)
    report = diagnose(serve(behaviour) + "/v1", "tiny-model", None, timeout_s=2)
    failed = check(report, "models" if everywhere else "completion")
    assert failed.status == "fail" and "HTML page" in failed.detail and "Sign in - Gateway" in failed.detail
    assert "not a web page" in failed.fix
    if everywhere:
        assert statuses(report)["completion"] == "skip"


def test_https_to_a_plain_http_server(serve):
    origin = serve().replace("http://", "https://")
    connection = check(diagnose(origin + "/v1", "tiny-model", None, timeout_s=2), "connection")
    assert connection.status == "fail" and "does not speak TLS" in connection.detail
    assert "use http:// instead of https://" in connection.fix


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> tuple[ssl.SSLContext, Path]:
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=20)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def test_self_signed_certificate(serve, self_signed, monkeypatch):
    context, cert = self_signed
    base = serve(tls=context) + "/v1"
    connection = check(diagnose(base, "tiny-model", None, timeout_s=2), "connection")
    assert connection.status == "fail" and "certificate verify failed" in connection.detail
    assert "self-signed" in connection.detail and "SSL_CERT_FILE" in connection.fix
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the fix works
    assert_ok(diagnose(base, "tiny-model", None, timeout_s=2))


def test_http_to_a_tls_server(serve, self_signed):
    origin = serve(tls=self_signed[0]).replace("https://", "http://")
    connection = check(diagnose(origin + "/v1", "tiny-model", None, timeout_s=2), "connection")
    assert connection.status == "fail" and "without an HTTP answer" in connection.detail
    assert "use https://" in connection.fix


def test_timeout_says_which_and_how_long(serve):
    report = diagnose(serve(Behaviour(delay_s=1.0)) + "/v1", "tiny-model", None, timeout_s=0.2)
    connection = check(report, "connection")
    assert connection.status == "fail" and "read timeout" in connection.detail and "0.2 s" in connection.detail
    assert "--timeout" in connection.fix
    assert [c.status for c in report.checks[3:]] == ["skip"] * (len(CHECK_NAMES) - 3)


def test_connection_refused():
    report = diagnose(f"http://127.0.0.1:{closed_port()}/v1", "tiny-model", None, timeout_s=1)
    connection = check(report, "connection")
    assert connection.status == "fail" and "connection refused" in connection.detail
    assert "start the server" in connection.fix


def doctor_cli(*argv: str) -> int:
    return main(["doctor", *argv])


def test_cli_exit_codes_and_no_key_in_output(serve, monkeypatch, capsys):
    origin = serve(Behaviour(key=KEY))
    monkeypatch.setenv("KVLAB_BASE_URL", origin + "/v1")
    monkeypatch.setenv("KVLAB_MODEL_ID", "tiny-model")
    monkeypatch.setenv("KVLAB_API_KEY", KEY)
    assert doctor_cli("--timeout", "2") == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and KEY not in out
    monkeypatch.setenv("OTHER_API_KEY", WRONG_KEY)
    assert doctor_cli("--api-key-env", "OTHER_API_KEY", "--model", "other-model") == 2  # the user's to fix
    captured = capsys.readouterr()
    assert "FAIL  auth" in captured.out and "OTHER_API_KEY" in captured.out
    assert captured.err == "error: doctor: 1 check(s) failed; the report above gives the fix for each\n"
    assert WRONG_KEY not in captured.out + captured.err and KEY not in captured.out + captured.err
    monkeypatch.delenv("KVLAB_BASE_URL")
    assert doctor_cli() == 2
    assert "KVLAB_BASE_URL" in capsys.readouterr().err


def page_text(at: AppTest, inputs: bool = True) -> str:
    """What the page shows (with what its text inputs hold, unless ``inputs`` is false)."""
    kinds = ("markdown", "caption", "error", "warning", "success", "info") + (("text_input",) if inputs else ())
    parts = [str(e.value) for kind in kinds for e in at.get(kind)]
    parts += [frame.value.to_csv() for frame in at.dataframe]
    return "\n".join(parts).replace("\\", "")


def test_page_shows_the_diagnosis_and_never_the_key(serve, monkeypatch):
    monkeypatch.setenv("KVLAB_API_KEY", WRONG_KEY)
    monkeypatch.setenv("KVLAB_MODEL_ID", "tiny-model")
    monkeypatch.setenv("KVLAB_BASE_URL", serve(Behaviour(key=KEY)) + "/v1")  # where the key belongs
    at = AppTest.from_file(PAGE, default_timeout=SAFETY_S).run()
    assert not at.exception
    assert "environment variable KVLAB_API_KEY" in page_text(at)
    at.button(key="doctor_check").click().run()
    assert not at.exception
    text = page_text(at)
    assert "1 check(s) failed" in text and "rejects the key" in text and "Fix:" in text
    assert "auth" in at.dataframe[0].value["Check"].tolist()
    assert WRONG_KEY not in text and KEY not in text and "****" in text


def test_the_doctor_imports_nothing_heavy():
    """The page and the CLI import kvlab.doctor: it must load without torch."""
    code = "import sys, kvlab.doctor, kvlab.cli.doctor; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_S, check=True)
    assert result.stdout.strip() == "[]"


# -- the rules a run applies too (kvlab.engines.endpoint_rules) --------------------------------------


@pytest.mark.parametrize(("requested", "served", "model", "verdict"), [
    ("a", ["a", "b"], "a", "served"),
    ("c", ["a", "b"], None, "not_served"),
    ("c", [], "c", "unlisted"),
    (None, ["a"], "a", "only"),
    (None, ["a", "b"], None, "ambiguous"),
    (None, [], None, "none_listed"),
])
def test_the_model_rule(requested, served, model, verdict):
    choice = choose_model(requested, served)
    assert (choice.model, choice.verdict) == (model, verdict)
    assert bool(choice.refusal("http://h/v1")) is (model is None)


def test_a_run_refuses_the_base_url_mistakes_the_doctor_corrects(monkeypatch):
    monkeypatch.delenv("KVLAB_API_KEY", raising=False)
    raw = "http://user:pw-123456789@127.0.0.1:9/v1/v1/chat/completions"
    fix = diagnose(raw, "m", None, timeout_s=0.5).checks[0].fix
    with pytest.raises(ConfigError) as refused:
        openai_endpoint(raw, "m", "KVLAB_API_KEY")
    assert "use http://127.0.0.1:9/v1 as the base URL" in fix and "use http://127.0.0.1:9/v1 as the base URL" in \
        str(refused.value)
    assert "pw-123456789" not in str(refused.value) and "/v1 appears twice" in str(refused.value)
    monkeypatch.setenv("KVLAB_API_KEY", "sk-tést-key-0000")
    with pytest.raises(ConfigError, match="cannot carry"):
        openai_endpoint("http://127.0.0.1:9/v1", "m", "KVLAB_API_KEY")
    assert error_message({"error": {"message": "no such model"}}) == "no such model"
    assert error_message({"detail": "Not Found"}) == "Not Found" and error_message("oops") is None


@pytest.mark.parametrize(("owned_by", "said"), [
    ("llamacpp", "llama.cpp (its models are owned_by 'llamacpp'): kvlab measures accuracy, latency and tokens; not "
                 "fidelity"),
    ("me", "llama.cpp (its models are owned_by 'me')"),
    ("vllm", "vLLM (its models are owned_by 'vllm'): kvlab measures accuracy, latency and fidelity"),
    ("acme", "not an engine kvlab knows by its model list (owned_by 'acme')"),
    (None, "not an engine kvlab knows by its model list (no owned_by)"),
])
def test_the_engine_is_recognised_by_its_model_list_and_says_what_kvlab_measures_there(serve, owned_by, said):
    report = diagnose(serve(Behaviour(owned_by=owned_by)) + "/v1", "tiny-model", None)
    engine = check(report, "engine")
    assert engine.status == "ok" and engine.detail.startswith(said), engine.detail


# -- which variable is read as a key, and where it goes (issue 47, row 1) -----------------------------------------


@pytest.mark.parametrize("var", ["HOME", "KVLAB_DATABASE_URL"])
def test_the_cli_reads_no_variable_that_holds_no_key_and_sends_nothing(serve, monkeypatch, capsys, var):
    """`kvlab doctor --api-key-env HOME` is the user's mistake: exit 2 in one line, no request sent."""
    monkeypatch.setenv("KVLAB_DATABASE_URL", "postgresql://kvlab:db-password-0123@db.internal/kvlab")
    behaviour = Behaviour()
    assert doctor_cli("--base-url", serve(behaviour) + "/v1", "--api-key-env", var, "--timeout", "2") == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {var} is not a key variable: kvlab reads an API key only from a variable "
                                   "named <NAME>_API_KEY") and captured.err.count("\n") == 1
    assert behaviour.seen == [] and "db-password" not in captured.out + captured.err


def test_the_cli_sends_a_key_variable_to_the_url_its_user_gives(serve, monkeypatch, capsys):
    """The CLI's user owns its environment and its command line: the key goes where the command says."""
    behaviour = Behaviour(key=KEY)
    monkeypatch.setenv("KVLAB_API_KEY", KEY)
    assert doctor_cli("--base-url", serve(behaviour) + "/v1", "--model", "tiny-model", "--timeout", "2") == 0
    assert set(behaviour.authorization) == {f"Bearer {KEY}"}


@pytest.mark.parametrize("var", ["HOME", "KVLAB_DATABASE_URL"])
def test_the_page_sends_no_variable_that_holds_no_key(serve, monkeypatch, var):
    """Issue 47 row 1: "Key variable" = HOME and Check sent `Authorization: Bearer /root`."""
    monkeypatch.setenv("KVLAB_DATABASE_URL", "postgresql://kvlab:db-password-0123@db.internal/kvlab")
    behaviour = Behaviour()
    at = AppTest.from_file(PAGE, default_timeout=SAFETY_S).run()
    at.text_input(key="doctor_base_url").input(serve(behaviour) + "/v1")
    at.text_input(key="doctor_key_var").input(var).run()
    assert f"{var} is not a key variable" in page_text(at)
    at.button(key="doctor_check").click().run()
    assert not at.exception
    assert [e.value.replace("\\", "") for e in at.error] == [
        f"{var} is not a key variable: kvlab reads an API key only from a variable named <NAME>_API_KEY (upper case, "
        "e.g. KVLAB_API_KEY or OPENAI_API_KEY) in the environment or .streamlit/secrets.toml"]  # one line
    assert behaviour.seen == [] and "/root" not in page_text(at) and "db-password" not in page_text(at)


def test_the_page_sends_the_dashboards_key_only_to_the_url_it_belongs_to(serve, monkeypatch):
    """KVLAB_API_KEY goes to KVLAB_BASE_URL's server; a base URL typed on the page gets no key, and the page and
    the report say why; a key typed on the page goes with that check."""
    home, other = Behaviour(key=KEY), Behaviour(key=KEY)
    home_url, other_url = serve(home) + "/v1", serve(other) + "/v1"
    monkeypatch.setenv("KVLAB_BASE_URL", home_url)
    monkeypatch.setenv("KVLAB_API_KEY", KEY)
    monkeypatch.setenv("KVLAB_MODEL_ID", "tiny-model")
    at = AppTest.from_file(PAGE, default_timeout=SAFETY_S).run()
    assert "sent to this URL, the one it belongs to" in page_text(at)
    at.button(key="doctor_check").click().run()
    assert "All checks passed." in page_text(at) and set(home.authorization) == {f"Bearer {KEY}"}

    at.text_input(key="doctor_base_url").input(other_url).run()
    origin = other_url.removesuffix("/v1")
    assert f"Key: none sent. KVLAB_API_KEY belongs to {home_url.removesuffix('/v1')} (KVLAB_BASE_URL)" in \
        page_text(at)
    at.button(key="doctor_check").click().run()
    text = page_text(at)
    assert not at.exception and other.seen and set(other.authorization) == {""}  # asked, without the key
    assert f"none was sent (KVLAB_API_KEY belongs to {home_url.removesuffix('/v1')} (KVLAB_BASE_URL), not to " \
           f"{origin}: it is not sent there" in text and "type the key on the page" in text and KEY not in text

    other.authorization.clear()
    at.text_input(key="doctor_typed_key").input(KEY).run()
    assert "typed on this page" in page_text(at)
    at.button(key="doctor_check").click().run()
    assert "All checks passed." in page_text(at) and set(other.authorization) == {f"Bearer {KEY}"}
    assert KEY not in page_text(at, inputs=False) and "****" in page_text(at, inputs=False)
