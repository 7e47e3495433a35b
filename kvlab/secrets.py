"""Where endpoint settings and API keys come from -- the environment or ``.streamlit/secrets.toml``
-- and how secrets are kept out of everything kvlab prints, logs, stores or exports.

Keys are read at the moment they are needed and never written anywhere: not into specs, the
database, logs, exports or share links.  Specs name the *variable* (``api_key_env``), never
the value.  :func:`mask` is the only form in which a key is ever shown.

Credentials inside URLs (``http://user:password@host/v1``) are treated like keys: a spec that
holds one is refused (:func:`kvlab.core.experiment_spec.parse_spec`); one in ``KVLAB_BASE_URL`` (a secret
location) is dropped before any request, because kvlab authenticates only with the key, sent as
``Authorization: Bearer`` -- httpx would otherwise send the URL's user:password as Basic auth
*instead of* the key.  :func:`redact` is the last line of defence: the store (events, trial and
item errors), every log record (:func:`install_log_redaction`), kvlab's error log, ``kvlab show``,
the exports and the HTML report pass their text through it.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvlab.core.key_vars import DEFAULT_KEY_VAR as DEFAULT_KEY_VAR  # re-exported: the key settings live here
from kvlab.core.key_vars import key_var_problem as key_var_problem
from kvlab.core.urls import HIDDEN, URL_USERINFO, strip_credentials, url_credentials, url_passwords

BASE_URL_VAR = "KVLAB_BASE_URL"
MODEL_ID_VAR = "KVLAB_MODEL_ID"
DATABASE_URL_VAR = "KVLAB_DATABASE_URL"
#: The root of a ``kvlab serve`` the dashboard's playground attaches to (:mod:`kvlab.dashboard.warm_engine`).
PLAYGROUND_URL_VAR = "KVLAB_PLAYGROUND_URL"
#: Where each key may go besides its ``<P>_BASE_URL`` (:func:`key_destinations`): settings of the process, never
#: of a page or a link.
EXTRA_KEY_DESTINATIONS: dict[str, tuple[str, ...]] = {DEFAULT_KEY_VAR: (PLAYGROUND_URL_VAR,)}
DEFAULT_PORTS = {"http": 80, "https": 443}
#: Environment variables whose values :func:`redact` masks wherever they appear.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
#: Shorter values are not masked inside text (a 4-letter password would mangle every word that
#: contains it); URLs lose their user:password part whatever its length.
MIN_SECRET_CHARS = 8


def secrets_files() -> list[Path]:
    """The secrets files Streamlit itself reads, most specific first (``KVLAB_SECRETS_FILE`` overrides)."""
    if os.environ.get("KVLAB_SECRETS_FILE"):
        return [Path(os.environ["KVLAB_SECRETS_FILE"])]
    return [Path.cwd() / ".streamlit" / "secrets.toml", Path.home() / ".streamlit" / "secrets.toml"]


def _from_secrets_file(name: str) -> tuple[str, str] | None:
    for path in secrets_files():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        value = data.get(name)
        if isinstance(value, str):
            return value, str(path)
    return None


def read_setting(name: str) -> tuple[str | None, str]:
    """``(value, where it came from)``: the environment variable ``name``, else the top-level key
    ``name`` of the secrets file; ``(None, "not set")`` when neither has it.  A key read here is masked from
    then on (:func:`remember_secret`); of a URL setting (``*_URL``: a base URL, the database's) only the
    ``user:password`` is, so that an address stays readable wherever it is printed."""
    if os.environ.get(name) is not None:
        value, source = os.environ[name], f"environment variable {name}"
    elif found := _from_secrets_file(name):
        value, source = found[0], f"{name} in {found[1]}"
    else:
        return None, "not set"
    if name.endswith("_URL"):
        remember_url_credentials(value)
    elif name != MODEL_ID_VAR:
        remember_secret(value)
    return value, source


def mask(secret: str | None) -> str:
    """A key as it may be shown: its last 4 characters, never more than a quarter of it."""
    if not secret:
        return "(none)"
    tail = secret.strip()[-4:] if len(secret.strip()) >= 16 else ""
    return f"****{tail}"


# -- which key may go to which URL ---------------------------------------------------------------


def key_destinations(key_var: str) -> tuple[str, ...]:
    """The settings naming the URLs the key in ``key_var`` belongs to: ``<P>_BASE_URL`` for ``<P>_API_KEY``
    (``KVLAB_API_KEY`` -> ``KVLAB_BASE_URL``, ``OPENAI_API_KEY`` -> ``OPENAI_BASE_URL``), and for
    ``KVLAB_API_KEY`` the playground's ``KVLAB_PLAYGROUND_URL`` too."""
    return (key_var.removesuffix("API_KEY") + "BASE_URL", *EXTRA_KEY_DESTINATIONS.get(key_var, ()))


def origin(url: str) -> str | None:
    """``scheme://host:port`` of ``url`` (the default port written out, no user:password), None when it has
    no http(s) scheme or host: what :func:`key_for` compares."""
    try:
        parts = urlsplit(strip_credentials(url.strip()))
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port that is no number
        return None
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


@dataclass(frozen=True)
class KeyChoice:
    """The key a request to one URL carries: ``key`` (None: none), ``source`` (where it was read),
    ``withheld``, why a key that is set is not sent there (empty when it is sent, or none is set), and ``fix``,
    how to have it sent."""

    key: str | None = field(repr=False)
    source: str
    withheld: str = ""
    fix: str = ""


def key_for(key_var: str, url: str) -> KeyChoice:
    """The key in ``key_var`` for a request to ``url`` that a page or a link aimed: sent only where one of the
    settings of :func:`key_destinations` (the process's environment or secrets file) points, at the same
    scheme, host and port -- a link may fill a form, not aim the dashboard's credentials at a host of its
    choosing.  ``ValueError`` (:func:`key_var_problem`) for a variable that holds no key."""
    if problem := key_var_problem(key_var):
        raise ValueError(problem)
    key, source = read_setting(key_var)
    if not key:
        return KeyChoice(None, source)
    target = origin(url)
    declared = {var: read_setting(var)[0] for var in key_destinations(key_var)}
    if target is not None and any(origin(value) == target for value in declared.values() if value):
        return KeyChoice(key, source)
    places = [f"{origin(value) or hide_url(value)} ({var})" for var, value in declared.items() if value]
    belongs = f"belongs to {' and '.join(places)}" if places else f"is declared for no URL ({' or '.join(declared)})"
    return KeyChoice(None, source, f"{key_var} {belongs}, not to {target or hide_url(url)}: it is not sent there",
                     f"type the key on the page, or set {next(iter(declared))} to this endpoint in the dashboard's "
                     "environment or .streamlit/secrets.toml")


def hide_url(url: str) -> str:
    """``url`` as a message may show it: no user:password, at most 80 characters."""
    shown = strip_credentials(url.strip())
    return shown if len(shown) <= 80 else shown[:77] + "..."


# -- credentials in URLs ---------------------------------------------------------------------------


def remember_url_credentials(url: str) -> None:
    """Keep the password of ``url`` among the values :func:`redact` masks."""
    for password in url_passwords(url):
        remember_secret(password, HIDDEN)


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint as a client needs it.  ``repr`` never shows the key.

    ``base_url`` never holds credentials; ``dropped_credentials`` says that the configured URL had
    a ``user:password@`` part that kvlab took out (it sends the key as a Bearer token instead).
    """

    base_url: str
    model_id: str | None
    api_key: str | None = field(repr=False)
    key_source: str  # "environment variable KVLAB_API_KEY", "... in .streamlit/secrets.toml", "not set"
    dropped_credentials: bool = False

    @property
    def masked_key(self) -> str:
        return mask(self.api_key)


def resolve_endpoint(base_url: str | None, model_id: str | None, api_key_env: str = DEFAULT_KEY_VAR) -> Endpoint:
    """Fill what the spec leaves out from ``KVLAB_BASE_URL`` / ``KVLAB_MODEL_ID`` and read the key
    from ``api_key_env`` (environment first, then the secrets file; ``ValueError`` for a variable that
    holds no key, :func:`key_var_problem`).  A ``user:password@`` in the URL is dropped
    (``dropped_credentials`` says so): kvlab authenticates with the key only."""
    if problem := key_var_problem(api_key_env):
        raise ValueError(problem)
    base_url = base_url or read_setting(BASE_URL_VAR)[0]
    if not base_url:
        raise ValueError(f"no endpoint: set backend.base_url in the spec or {BASE_URL_VAR} in the environment "
                         "or .streamlit/secrets.toml (for example http://127.0.0.1:8000/v1)")
    remember_url_credentials(base_url)
    dropped = url_credentials(base_url) is not None
    model_id = model_id or read_setting(MODEL_ID_VAR)[0]
    key, source = read_setting(api_key_env)
    return Endpoint(base_url=strip_credentials(base_url), model_id=model_id, api_key=key, key_source=source,
                    dropped_credentials=dropped)


# -- redaction -------------------------------------------------------------------------------------

_remembered: dict[str, str] = {}  # secret value -> how it is shown


def remember_secret(value: str | None, shown: str | None = None) -> None:
    """Mask ``value`` wherever :func:`redact` meets it from now on (in this process)."""
    for secret in {value or "", (value or "").strip()}:
        if len(secret) >= MIN_SECRET_CHARS:
            _remembered[secret] = shown or mask(secret)


def known_secrets() -> dict[str, str]:
    """Every secret value :func:`redact` masks, with how it is shown: those read through
    :func:`read_setting`, the values of environment variables named like secrets (``*KEY*``,
    ``*TOKEN*``, ``*PASSWORD*``, ...) and the passwords in ``KVLAB_BASE_URL`` / ``KVLAB_DATABASE_URL``."""
    found = dict(_remembered)
    for name, value in os.environ.items():
        if name in (BASE_URL_VAR, DATABASE_URL_VAR):
            found |= {password: HIDDEN for password in url_passwords(value) if len(password) >= MIN_SECRET_CHARS}
        elif SECRET_NAME.search(name) and len(value.strip()) >= MIN_SECRET_CHARS:
            found.setdefault(value.strip(), mask(value))
    return found


def redact(text: str, secrets: dict[str, str] | None = None) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``***@`` and every known
    secret value (:func:`known_secrets`, or ``secrets`` when given) masked."""
    text = URL_USERINFO.sub(rf"\1{HIDDEN}@", text)
    secrets = known_secrets() if secrets is None else secrets
    for secret in sorted(secrets, key=len, reverse=True):  # a secret inside a longer one goes with it
        if secret in text:
            text = text.replace(secret, secrets[secret])
    return text


def redact_data(value: Any) -> Any:
    """:func:`redact` applied to every string (and dict key) of nested dicts, lists and tuples."""
    secrets = known_secrets()

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return redact(item, secrets)
        if isinstance(item, dict):
            return {walk(k): walk(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [walk(v) for v in item]
        return item

    return walk(value)


def redact_record(record: logging.LogRecord) -> None:
    """Pass a log record through :func:`redact`: its format string, each argument and the text of
    its traceback (formatted here, so that no formatter formats it again).

    Arguments keep their place, so formatters that read ``record.args`` (uvicorn's access log)
    still work; numbers stay numbers for ``%d``, anything else is redacted as its ``str``.
    """
    secrets = known_secrets()
    if isinstance(record.msg, str):
        record.msg = redact(record.msg, secrets)
    if isinstance(record.args, dict):
        record.args = {key: _redact_arg(value, secrets) for key, value in record.args.items()}
    elif isinstance(record.args, tuple):
        record.args = tuple(_redact_arg(value, secrets) for value in record.args)
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text, secrets)
    if record.stack_info:
        record.stack_info = redact(record.stack_info, secrets)


def _redact_arg(value: Any, secrets: dict[str, str]) -> Any:
    if value is None or isinstance(value, int | float):
        return value
    return redact(str(value), secrets)


_log_redaction_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process creates from now on (idempotent).

    A record factory rather than a handler filter: it also covers handlers that are added later
    or that kvlab does not own (uvicorn's, Streamlit's, logging's last-resort stderr handler).
    """
    global _log_redaction_installed
    if _log_redaction_installed:
        return
    make_record = logging.getLogRecordFactory()

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        redact_record(record)
        return record

    logging.setLogRecordFactory(redacting_factory)
    _log_redaction_installed = True
