"""``kvlab doctor``: why an OpenAI-compatible endpoint does not work, each cause with its fix in one line.

The checks use plain HTTP calls (httpx with ``trust_env=True``, as the ``openai`` client has it,
so proxy variables and ``SSL_CERT_FILE`` act exactly as they do in a run) rather than the
``openai`` client, so that status codes and bodies can be inspected.  They run in order; a check
that an earlier failure makes meaningless is marked ``skip``.  Where the base URL has a
fixable mistake (``/v1`` twice, an endpoint path, no ``/v1``), the rest is checked against the
corrected URL, so one run shows every problem.

The key is never shown: only :func:`kvlab.secrets.mask` of it, and every detail is scrubbed of
it, since servers echo keys in their error messages.  A ``user:password@`` in the base URL is
taken out before any request (kvlab never sends it: httpx would send it as Basic auth instead of
the key) and reported, so that a server's 401 is blamed on what was really sent.
"""

from __future__ import annotations

import difflib
import html
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from kvlab.core.urls import strip_credentials
from kvlab.engines.endpoint_rules import (
    SET_MODEL_ID,
    BaseURLError,
    choose_model,
    error_message,
    key_problem,
    parse_base_url,
    sendable,
)
from kvlab.secrets import DEFAULT_KEY_VAR, KeyChoice, mask, redact, remember_secret, remember_url_credentials

Status = Literal["ok", "warn", "fail", "skip"]
CHECK_NAMES = ("base URL", "proxy", "connection", "auth", "models", "completion", "engine")
DEFAULT_PORTS = {"http": 80, "https": 443, "socks5": 1080, "socks5h": 1080}
MAX_BODY_CHARS = 200
MAX_LISTED_MODELS = 10
LABELS: dict[Status, str] = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@dataclass(frozen=True)
class Check:
    """One step of the diagnosis; ``fix`` is one line, empty when there is nothing to do."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    """The checks in order, and what was checked (the base URL without credentials, the key masked)."""

    base_url: str
    model_id: str | None
    key: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check failed (a warning is something that works but deserves a look)."""
        return all(check.status != "fail" for check in self.checks)

    @property
    def problems(self) -> list[Check]:
        return [check for check in self.checks if check.status in ("fail", "warn")]

    def to_text(self) -> str:
        lines = [f"kvlab doctor: {self.base_url or '(no base URL)'}  model: {self.model_id or '-'}  key: {self.key}"]
        width = max(len(name) for name in CHECK_NAMES)
        for check in self.checks:
            lines.append(f"  {LABELS[check.status]:4}  {check.name:{width}}  {check.detail}")
            if check.fix:
                lines.append(f"  {'':4}  {'':{width}}  fix: {check.fix}")
        failed = sum(check.status == "fail" for check in self.checks)
        warned = sum(check.status == "warn" for check in self.checks)
        summary = f"{failed} check(s) failed" if failed else "all checks passed"
        return "\n".join(lines + [summary + (f", {warned} warning(s)" if warned else "")])


@dataclass(frozen=True)
class _Proxy:
    """The proxy httpx routes a URL through, and the variable that set it."""

    var: str
    url: str

    @property
    def shown(self) -> str:
        return f"{self.var}={redact(self.url)}"


def diagnose(base_url: str, model_id: str | None, api_key: str | None, timeout_s: float = 10.0,
             key_source: str = "", key_var: str = DEFAULT_KEY_VAR, withheld: KeyChoice | None = None) -> DoctorReport:
    """Check the endpoint step by step.  ``key_source`` says where ``api_key`` came from
    (:func:`kvlab.secrets.read_setting`'s second value); ``key_var`` is the variable to name in fixes;
    ``withheld``: the key in ``key_var`` is set but not sent to this URL (:func:`kvlab.secrets.key_for`, the
    dashboard's page), which a 401 is then blamed on."""
    base_url = (base_url or "").strip()
    remember_url_credentials(base_url)
    remember_secret(api_key)  # servers echo keys: every detail is redacted, also before it is cut short
    run = _Run(model_id or None, api_key, timeout_s, key_source or key_var, key_var)
    run.withheld = withheld if withheld and withheld.withheld else None
    run.start(base_url)
    unset = f"{key_var} not sent to this URL" if run.withheld else f"{key_var} not set"
    key = f"{mask(api_key)} ({key_source or key_var})" if api_key and api_key.strip() else f"none ({unset})"
    return DoctorReport(redact(strip_credentials(base_url)), model_id or None, key, run.finish())


class _Run:
    """The state the checks share as they go: the key to send, the client, the results so far."""

    def __init__(self, model_id: str | None, api_key: str | None, timeout_s: float, key_source: str,
                 key_var: str) -> None:
        self.model_id = model_id
        stripped = (api_key or "").strip() or None  # a blank key is no key
        self.raw_key = api_key if stripped else None
        self.key_problem = key_problem(api_key) if api_key and stripped else None
        self.key = stripped if stripped and sendable(stripped) else None
        self.timeout_s = timeout_s
        self.key_source = key_source
        self.key_var = key_var
        self.checks: dict[str, Check] = {}
        self.client: httpx.Client | None = None
        self.proxy: _Proxy | None = None
        self.url_credentials = False  # the base URL held a user:password (taken out, never sent)
        self.withheld: KeyChoice | None = None  # the key is set but not sent here

    def set(self, name: str, status: Status, detail: str, fix: str = "") -> None:
        self.checks[name] = Check(name, status, detail, fix)

    def finish(self) -> list[Check]:
        """All checks in order, the ones never reached as ``skip``, none showing the key."""
        result, blocker = [], ""
        for name in CHECK_NAMES:
            check = self.checks.get(name) or Check(name, "skip", f"not run: the {blocker} check failed")
            blocker = name if check.status == "fail" else blocker
            result.append(Check(name, check.status, self.scrub(check.detail), self.scrub(check.fix)))
        return result

    def scrub(self, text: str) -> str:
        for secret in {self.raw_key or "", (self.raw_key or "").strip()}:
            if len(secret) >= 4:
                text = text.replace(secret, mask(secret))
        return redact(text)

    # -- the checks, in order ------------------------------------------------------------------

    def start(self, base_url: str) -> None:
        base = self.check_base_url(base_url)
        if base is None:
            return
        try:
            client = httpx.Client(timeout=self.timeout_s, trust_env=True, follow_redirects=True)
        except (ImportError, ValueError) as error:  # a proxy variable httpx cannot use (socks without socksio)
            self.set("proxy", "fail", f"a proxy variable cannot be used: {error}",
                     "unset it, or install httpx[socks] for a socks:// proxy")
            return
        with client:
            self.client = client
            self.check_endpoint(base)

    def check_base_url(self, raw: str) -> str | None:
        """The base URL to check the rest against, or None when it cannot be used at all."""
        try:
            base = parse_base_url(raw)
        except BaseURLError as error:
            self.set("base URL", "fail", error.detail, error.fix)
            return None
        self.url_credentials = base.had_credentials
        shown, fixed, notes = base.shown, base.url, list(base.mistakes)
        fix = f"use {fixed} as the base URL"
        if self.url_credentials:
            notes.append(f"it holds a user:password, which kvlab never sends (requests carry the key from "
                         f"{self.key_var} as a Bearer token) and a spec may not hold")
            fix += f" and put the key in {self.key_var} (environment or .streamlit/secrets.toml)"
        if notes:
            # Only the credentials: a run from KVLAB_BASE_URL works without them, so it is a warning.
            status: Status = "warn" if self.url_credentials and len(notes) == 1 else "fail"
            self.set("base URL", status, f"{shown}: {'; '.join(notes)} (checking the rest against {fixed})", fix)
        else:
            self.set("base URL", "ok", fixed)
        return fixed

    def check_endpoint(self, base: str) -> None:
        url = httpx.URL(base)
        self.proxy = _proxy_for(url)
        try:
            response = self.get(base + "/models")
        except httpx.HTTPError as error:
            self.connection_failed(url, error)
            return
        self.proxy_ok(url)
        self.set("connection", "ok", f"{_host_port(url)} answered HTTP {response.status_code} to GET /models "
                                     f"in {_ms(response)} ms")
        if response.status_code == 404 and "/v1" not in url.path:
            base, response = self.try_v1(base, response)
        if not self.check_auth(response):
            return
        model = self.check_models(response)
        if model is not None:
            self.check_completion(base, model)
            if self.checks["completion"].status == "ok":
                self.check_engine(response)

    def connection_failed(self, url: httpx.URL, error: httpx.HTTPError) -> None:
        if self.proxy and isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError)):
            problem = _proxy_problem(self.proxy, error, url.host, self.timeout_s)
            if problem:
                self.set("proxy", "fail", *problem)
                return
        self.proxy_ok(url)
        detail, fix = _connection_problem(error, url, self.timeout_s)
        if self.proxy:
            detail += f" (through the proxy {self.proxy.shown})"
        self.set("connection", "fail", detail, fix)

    def proxy_ok(self, url: httpx.URL) -> None:
        self.set("proxy", "ok", f"requests go through {self.proxy.shown}" if self.proxy else _no_proxy_detail(url))

    def try_v1(self, base: str, response: httpx.Response) -> tuple[str, httpx.Response]:
        """``<base>/models`` is 404: when ``<base>/v1/models`` exists, the base URL lacks ``/v1``."""
        try:
            found = self.get(base + "/v1/models")
        except httpx.HTTPError:
            return base, response
        if found.status_code not in (200, 401, 403):
            return base, response
        self.set("base URL", "fail", f"{redact(base)}/models is not found (HTTP 404) but {redact(base)}/v1/models "
                                     f"answers: add /v1 (checking the rest against {redact(base)}/v1)",
                 f"add /v1: use {redact(base)}/v1 as the base URL")
        return base + "/v1", found

    def check_auth(self, response: httpx.Response) -> bool:
        """Whether the later checks make sense: the key was accepted (or was not needed)."""
        if self.key_problem and self.key is None:
            self.set("auth", "fail", f"the key {mask(self.raw_key)} ({self.key_source}) {self.key_problem}",
                     f"set {self.key_var} to the key exactly as issued (no quotes or typographic characters)")
            return False
        if response.status_code in (401, 403):
            self.set("auth", "fail", *self.auth_failure(response))
            return False
        if self.key_problem:  # kvlab strips keys before use; curl and other clients do not
            where = self.key_source.removeprefix("environment variable ")
            self.set("auth", "warn",
                     f"the key {mask(self.raw_key)} ({self.key_source}) {self.key_problem}; the stripped key works",
                     f"strip it: remove the whitespace around the value of {where}")
        elif self.key:
            self.set("auth", "ok", f"the server accepts the key {mask(self.key)} ({self.key_source})")
        else:
            none = f"no key sent ({self.withheld.withheld})" if self.withheld else f"no key set ({self.key_var})"
            self.set("auth", "ok", f"{none}, and the server asks for none")
        return True

    def auth_failure(self, response: httpx.Response) -> tuple[str, str]:
        said = f"HTTP {response.status_code}: {_body_text(response)}"
        if self.url_credentials:
            said += "; the user:password in the base URL was not sent (kvlab authenticates with the key only)"
        if not self.key and self.withheld:
            return (f"the server wants an API key and none was sent ({self.withheld.withheld}; {said})",
                    self.withheld.fix)
        if not self.key:
            return (f"the server wants an API key and none is set ({self.key_var} is not set; {said})",
                    f"set {self.key_var} in the environment or in .streamlit/secrets.toml")
        if self.key_problem:
            detail = f"the key {mask(self.raw_key)} ({self.key_source}) {self.key_problem}"
            return (f"{detail}, and the server rejects the stripped key too ({said})",
                    f"strip it, and set {self.key_var} to a key this server accepts")
        return (f"the server rejects the key {mask(self.key)} ({self.key_source}; {said})",
                f"set {self.key_var} to a key this server accepts (the one from {self.key_source} is wrong or expired)")

    def check_models(self, response: httpx.Response) -> str | None:
        """The model to try a completion with (None: no completion makes sense)."""
        status = response.status_code
        if status == 404:
            if self.model_id:
                self.set("models", "warn", "the server has no GET /models (HTTP 404): the model id is not checked")
                return self.model_id
            self.set("models", "fail", "no model id given, and the server has no GET /models to list its models",
                     f"{SET_MODEL_ID} to the model the server serves")
            return None
        if status != 200:
            self.set("models", "fail", f"GET /models answered HTTP {status}: {_body_text(response)}",
                     self.status_fix(status))
            return self.model_id
        ids = _model_ids(response)
        if ids is None:
            self.set("models", "fail", *_not_openai(response, "GET /models", "a model list ('data')"))
            return None
        return self.pick_model(ids)

    def pick_model(self, ids: list[str]) -> str | None:
        """Judged by the rule kvlab's openai_compat engine applies (:func:`choose_model`): without a
        model id it takes the only model the server lists and refuses to guess among several."""
        listed, set_it = _listing(ids), SET_MODEL_ID
        choice = choose_model(self.model_id, ids)
        if choice.verdict == "served":
            self.set("models", "ok", f"'{self.model_id}' is served (the server has {len(ids)} model(s))")
        elif choice.verdict == "not_served":
            close = difflib.get_close_matches(self.model_id or "", ids, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            self.set("models", "fail", f"the server does not serve '{self.model_id}'{hint}; it has: {listed}",
                     f"{set_it} to one of: {listed}")
            return None
        elif choice.verdict == "unlisted":
            self.set("models", "warn", "the server lists no models: the model id is not checked")
        elif choice.verdict == "none_listed":
            self.set("models", "fail", "no model id given, and the server lists no models",
                     "load a model on the server")
        elif choice.verdict == "only":
            self.set("models", "warn", f"no model id given; the server has one, {listed}, and kvlab uses it",
                     f"{set_it} to {listed} to pin it")
        else:
            self.set("models", "fail", f"no model id given, and kvlab will not guess; the server has: {listed} "
                                       f"(trying {ids[0]})", f"{set_it} to one of them")
        return choice.model or (ids[0] if ids else None)

    def check_completion(self, base: str, model: str) -> None:
        """One token at temperature 0 from ``/completions``, else (404) from ``/chat/completions``."""
        for path, payload in (("/completions", {"prompt": "Hello"}),
                              ("/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]})):
            try:
                response = self.post(base + path, {"model": model, "max_tokens": 1, "temperature": 0, **payload})
            except httpx.HTTPError as error:
                detail, fix = _connection_problem(error, httpx.URL(base), self.timeout_s)
                self.set("completion", "fail", f"POST {path}: {detail}", fix)
                return
            if response.status_code != 404:
                break
        self.judge_completion(path, response, model)

    def check_engine(self, models: httpx.Response) -> None:
        """Which serving engine answers, by the ``owned_by`` of its model list, and what kvlab measures on it."""
        from kvlab.engines.servers import engine_owning

        owners = _owners(models)
        if server := engine_owning(owners):
            owner = next(o for o in owners if o in server.owned_by)
            self.set("engine", "ok", f"{server.title} (its models are owned_by '{owner}'): kvlab measures "
                                     f"{server.attached_note}")
            return
        said = f"owned_by '{owners[0]}'" if owners else "no owned_by"
        self.set("engine", "ok", f"not an engine kvlab knows by its model list ({said}): kvlab measures accuracy and "
                                 "latency, and fidelity if it answers prompt_logprobs and return_token_ids (probed "
                                 "once at the first run)")

    def judge_completion(self, path: str, response: httpx.Response, model: str) -> None:
        status, answered = response.status_code, _has_choices(response)
        if path == "/chat/completions" and status == 200 and answered:
            self.set("completion", "fail", "POST /completions is not found (HTTP 404) but /chat/completions answers: "
                                           "a chat-only server, and kvlab sends prompts to /completions",
                     "serve the model with a server that has /v1/completions (vLLM, SGLang, llama.cpp, kvlab serve)")
        elif status in (401, 403):
            self.set("auth", "fail", *self.auth_failure(response))
            self.set("completion", "skip", f"not run: POST {path} wants a key the server accepts")
        elif status != 200:
            tried = "POST /completions and /chat/completions" if status == 404 else f"POST {path}"
            self.set("completion", "fail", f"{tried} answered HTTP {status}: {_body_text(response)}",
                     self.status_fix(status))
        elif answered:
            self.set("completion", "ok", f"POST {path} with model '{model}' answered in {_ms(response)} ms")
        else:
            self.set("completion", "fail", *_not_openai(response, f"POST {path}", "choices"))

    def status_fix(self, status: int) -> str:
        if self.proxy and status in (407, 502):
            return f"the proxy ({self.proxy.var}) did not get through: add the host to NO_PROXY if it is not needed"
        if status == 404:
            return "check the base URL (it usually ends in /v1) and the model id"
        if status == 429:
            return "the server is rate-limiting: wait, or lower backend.max_concurrency"
        if 400 <= status < 500:
            return "the server rejected a minimal request: check the model id and the server's log"
        return "the server failed: see its log (a model that is still loading answers like this)"

    # -- HTTP ------------------------------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def get(self, url: str) -> httpx.Response:
        assert self.client is not None
        return self.client.get(url, headers=self.headers())

    def post(self, url: str, payload: dict[str, Any]) -> httpx.Response:
        assert self.client is not None
        return self.client.post(url, json=payload, headers=self.headers())


# -- pieces without state --------------------------------------------------------------------------


def _proxy_for(url: httpx.URL) -> _Proxy | None:
    """The proxy httpx (``trust_env=True``) uses for ``url``: ``<scheme>_proxy`` before ``all_proxy``,
    lowercase before uppercase (as urllib reads them), None when ``NO_PROXY`` exempts the host."""
    if _no_proxy_exempts(url.host):
        return None
    for scheme in (url.scheme, "all"):
        for var in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
            if os.environ.get(var):
                return _Proxy(var, os.environ[var])
    return None


def _no_proxy_exempts(host: str) -> bool:
    entries = [e.strip().lower() for e in (os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or "").split(",")]
    host = host.lower()
    return any(e == "*" or (e and (host == e.lstrip(".") or host.endswith("." + e.lstrip(".")))) for e in entries)


def _no_proxy_detail(url: httpx.URL) -> str:
    proxies = ", ".join(var for var in os.environ
                        if var.lower() in ("http_proxy", "https_proxy", "all_proxy") and os.environ[var])
    if not proxies:
        return "no proxy variable set"
    if _no_proxy_exempts(url.host):
        return f"NO_PROXY exempts {url.host} from {proxies}"
    return f"{proxies} set, none for {url.scheme}:// URLs"


def _proxy_problem(proxy: _Proxy, error: httpx.HTTPError, host: str, timeout_s: float) -> tuple[str, str] | None:
    """Why the proxy failed, or None when it accepts connections (the failure is further on)."""
    fix = f"unset {proxy.var}, or add {host} to NO_PROXY"
    if isinstance(error, httpx.ProxyError):
        return f"the proxy {proxy.shown} would not connect to {host}: {error}", fix
    target = httpx.URL(proxy.url if "://" in proxy.url else f"http://{proxy.url}")
    port = target.port or DEFAULT_PORTS.get(target.scheme, 80)
    try:
        socket.create_connection((target.host, port), timeout=min(timeout_s, 3.0)).close()
    except OSError as refused:
        where = "local proxy" if _is_loopback(target.host) else "proxy"
        reason = refused.strerror or type(refused).__name__
        return f"{where} failed: {proxy.shown} does not accept connections ({reason})", fix
    return None


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connection_problem(error: httpx.HTTPError, url: httpx.URL, timeout_s: float) -> tuple[str, str]:
    """A failed request as (what happened, the fix)."""
    where, message = _host_port(url), str(error) or type(error).__name__
    raise_timeout = "or raise the timeout (--timeout, backend.request_timeout_s)"
    if isinstance(error, httpx.ConnectTimeout):
        return (f"no connection to {where} within {timeout_s:g} s (connect timeout)",
                f"check the host and port, and that no firewall drops the connection; {raise_timeout}")
    if isinstance(error, httpx.TimeoutException):
        return (f"connected to {where}, but no answer within {timeout_s:g} s (read timeout)",
                f"the server is up but slow or stuck (a first model load?): check its log, {raise_timeout}")
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return _certificate_problem(message)
    if "WRONG_VERSION_NUMBER" in message or "record layer failure" in message:
        return (f"TLS handshake failed: {where} does not speak TLS ({_short(message)})",
                f"use http:// instead of https:// (the server speaks plain HTTP on port {url.port})")
    if "[SSL" in message:
        return f"TLS error with {where}: {_short(message)}", "check the scheme (http/https) and the server's TLS setup"
    if isinstance(error, (httpx.ReadError, httpx.RemoteProtocolError)) and url.scheme == "http":
        return (f"{where} dropped the connection without an HTTP answer ({_short(message)})",
                "if the server uses TLS, use https:// instead of http://; otherwise see its log")
    if "refused" in message.lower():
        return (f"nothing listens on {where} (connection refused)",
                "start the server, or correct the host and port in the base URL")
    if any(s in message for s in ("Name or service not known", "nodename nor servname", "name resolution",
                                  "No address associated", "getaddrinfo failed")):
        return f"the host name {url.host} does not resolve ({_short(message)})", "check the host name's spelling"
    return f"request to {where} failed: {_short(message)}", "check the host, the port and the network"


def _certificate_problem(message: str) -> tuple[str, str]:
    reason = message.split("certificate verify failed:")[-1].split("(_ssl")[0].strip()
    detail = f"TLS: certificate verify failed ({reason})"
    if "mismatch" in reason:
        return detail, "use the host name the certificate was issued for"
    if "expired" in reason:
        return detail, "the server's certificate has expired: renew it"
    return detail, ("the certificate is not trusted: set SSL_CERT_FILE to a PEM bundle with its CA "
                    "(httpx and openai read it)")


def _model_ids(response: httpx.Response) -> list[str] | None:
    """The model ids of an OpenAI ``/models`` answer, None when the body is not one."""
    body = _json(response)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


def _owners(response: httpx.Response) -> list[str]:
    """The ``owned_by`` of each model an OpenAI ``/models`` answer lists (where it says)."""
    body = _json(response)
    data = body.get("data") if isinstance(body, dict) else None
    return [str(item["owned_by"]) for item in data or [] if isinstance(item, dict) and item.get("owned_by")]


def _has_choices(response: httpx.Response) -> bool:
    body = _json(response)
    return isinstance(body, dict) and isinstance(body.get("choices"), list) and bool(body["choices"])


def _not_openai(response: httpx.Response, request: str, expected: str) -> tuple[str, str]:
    """A 200 answer without what an OpenAI server sends, said with the body's own message."""
    kind, text = _describe_body(response)
    if kind == "html":
        return (f"{request} answered HTTP 200 with {text}, instead of {expected}",
                "point the base URL at the OpenAI-compatible API, not a web page (for example http://host:8000/v1)")
    if kind == "error":
        return (f"{request} answered HTTP 200 with an error and no {expected}: {text}",
                "fix what the message says on the server (or on a gateway in front of it that answers instead)")
    return (f"{request} answered HTTP 200 without {expected} ({text}): not an OpenAI-compatible answer",
            "point the base URL at an OpenAI-compatible server (vLLM, SGLang, llama.cpp server, Ollama's /v1)")


def _body_text(response: httpx.Response) -> str:
    return _describe_body(response)[1]


def _describe_body(response: httpx.Response) -> tuple[str, str]:
    """``(kind, text)``: kind is html, error, json, text or empty; text is short enough for one line."""
    text = response.text
    if not text.strip():
        return "empty", "an empty body"
    if "html" in response.headers.get("content-type", "") or text.lstrip()[:15].lower().startswith(("<!doctype html",
                                                                                                    "<html")):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        shown = f"title '{_short(html.unescape(title.group(1)))}'" if title else _short(re.sub(r"<[^>]+>", " ", text))
        return "html", f"an HTML page, {shown}"
    body = _json(response)
    if body is None:
        return "text", _short(text)
    message = error_message(body)
    if message:
        return "error", _short(message)
    shape = f"keys {', '.join(map(str, body))}" if isinstance(body, dict) else type(body).__name__
    return "json", f"a JSON body with {shape}"


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _short(text: str) -> str:
    """One line of at most ``MAX_BODY_CHARS``, redacted before it is cut (half a secret would not match)."""
    text = redact(" ".join(text.split()))
    return text if len(text) <= MAX_BODY_CHARS else text[:MAX_BODY_CHARS - 1] + "…"


def _listing(ids: list[str]) -> str:
    more = len(ids) - MAX_LISTED_MODELS
    return ", ".join(ids[:MAX_LISTED_MODELS]) + (f" (and {more} more)" if more > 0 else "")


def _host_port(url: httpx.URL) -> str:
    return f"{url.host}:{url.port or DEFAULT_PORTS.get(url.scheme, 80)}"


def _ms(response: httpx.Response) -> int:
    return round(response.elapsed.total_seconds() * 1000)

