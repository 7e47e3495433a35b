"""The rules for an OpenAI-compatible endpoint that ``kvlab doctor`` and the ``openai_compat``
engine both apply, so that the doctor judges an endpoint exactly as a run will use it:

* the base URL: its scheme and host, the path mistakes kvlab corrects (an endpoint path such as
  ``/chat/completions``, ``/v1`` twice) and the ``user:password@`` it never sends
  (:mod:`kvlab.secrets` finds and hides it);
* the API key's form (characters an HTTP header cannot carry);
* which served model a run uses (:func:`choose_model`);
* the message of an error body (:func:`error_message`).

Nothing heavy is imported here: the doctor page loads this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from kvlab.core.urls import hide_credentials, strip_credentials, url_credentials
from kvlab.secrets import BASE_URL_VAR, MODEL_ID_VAR

EXAMPLE_BASE_URL = "http://127.0.0.1:8000/v1"
#: Paths the client appends to the base URL itself; "/chat/completions" before its suffix "/completions".
ENDPOINT_PATHS = ("/chat/completions", "/completions", "/models", "/embeddings")
#: How to name the model id setting in a fix.
SET_MODEL_ID = f"set {MODEL_ID_VAR} or backend.model_id (or --model)"


# -- the base URL ----------------------------------------------------------------------------------


class BaseURLError(ValueError):
    """A base URL that cannot be used at all; ``fix`` says what to write instead."""

    def __init__(self, detail: str, fix: str):
        super().__init__(f"{detail}; {fix}")
        self.detail, self.fix = detail, fix


@dataclass(frozen=True)
class BaseURL:
    """A base URL as kvlab uses it."""

    url: str  # what requests go to: corrected, without credentials
    shown: str  # as configured, credentials hidden
    mistakes: tuple[str, ...]  # path mistakes that ``url`` corrects
    had_credentials: bool  # a ``user:password@`` was taken out (kvlab sends the key only)


def parse_base_url(raw: str) -> BaseURL:
    """``raw`` checked and corrected; raises :class:`BaseURLError` when it cannot be used."""
    raw = (raw or "").strip()
    if not raw:
        raise BaseURLError("no base URL given",
                           f"set {BASE_URL_VAR} or backend.base_url (for example {EXAMPLE_BASE_URL})")
    shown = hide_credentials(raw)
    if "://" not in raw:
        with_scheme = f"http://{strip_credentials(raw)}"
        if not _valid_url(with_scheme):  # "not a url at all": no scheme would make it one
            raise BaseURLError(f"{shown} is not a URL",
                               f"give the server's base URL, scheme included, for example {EXAMPLE_BASE_URL}")
        raise BaseURLError(f"{shown} has no scheme", f"write it as {with_scheme} (https:// if the server uses TLS)")
    parts = urlsplit(strip_credentials(raw))
    if parts.scheme.lower() not in ("http", "https"):
        raise BaseURLError(f"{parts.scheme}:// is not HTTP",
                           f"use http:// or https:// (for example {EXAMPLE_BASE_URL})")
    path, mistakes = _fixed_path(parts.path.rstrip("/"))
    fixed = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    if not _valid_url(fixed):
        raise BaseURLError(f"{shown} has no valid host and port", f"write it like {EXAMPLE_BASE_URL}")
    return BaseURL(fixed, shown, tuple(mistakes), url_credentials(raw) is not None)


def server_root(base_url: str) -> str:
    """The server's root (where ``/metrics`` and ``/health`` live): the base URL without ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def _fixed_path(path: str) -> tuple[str, list[str]]:
    """The base URL's path without an endpoint path or a doubled ``/v1``, and what was wrong."""
    mistakes = []
    for endpoint in ENDPOINT_PATHS:
        if path.endswith(endpoint):
            path = path.removesuffix(endpoint)
            mistakes.append(f"it includes the endpoint path {endpoint}, which the client adds itself")
            break
    if re.search(r"/v1/v1(/|$)", path):
        path = re.sub(r"(/v1)+(?=/|$)", "/v1", path)
        mistakes.append("/v1 appears twice")
    return path, mistakes


def _valid_url(url: str) -> bool:
    try:
        return bool(httpx.URL(url).host) and " " not in url
    except httpx.InvalidURL:  # a port that is not a number, say
        return False


# -- the API key -----------------------------------------------------------------------------------


def key_problem(key: str) -> str | None:
    """What is wrong with a key's form (None: nothing): whitespace around it, or characters an
    HTTP header cannot carry.  kvlab strips keys before use; other clients do not."""
    stripped = key.strip()
    if not sendable(stripped):
        return "contains characters an HTTP header cannot carry (non-ASCII or control characters)"
    if stripped != key:
        return "has leading/trailing whitespace (a newline or spaces)"
    return None


def sendable(key: str) -> bool:
    """Whether an HTTP header can carry ``key`` (printable ASCII)."""
    return key.isascii() and all(32 <= ord(char) < 127 for char in key)


# -- the model -------------------------------------------------------------------------------------

Verdict = Literal["served", "unlisted", "only", "not_served", "none_listed", "ambiguous"]


@dataclass(frozen=True)
class ModelChoice:
    """Which model a run sends requests to, given the model id asked for and the served ones.

    ``model`` is None when kvlab refuses to choose: the id asked for is not served, or none was
    asked for and the server lists none or several (kvlab never guesses among several).
    """

    model: str | None
    verdict: Verdict
    served: tuple[str, ...]
    requested: str | None = None

    @property
    def ok(self) -> bool:
        return self.model is not None

    def refusal(self, where: str) -> str:
        """Why no model was chosen, with the fix, for an error message ('' when one was)."""
        listed = ", ".join(self.served)
        if self.verdict == "not_served":
            return (f"model '{self.requested}' is not served by {where}; it serves: {listed}; "
                    f"{SET_MODEL_ID} to one of them")
        if self.verdict in ("none_listed", "ambiguous"):
            return f"{where} serves {listed or 'no models'}: {SET_MODEL_ID} to one of them"
        return ""


def choose_model(requested: str | None, served: list[str]) -> ModelChoice:
    """The model id to use: the one asked for when the server lists it (or lists nothing to check it
    against), else the only one the server lists."""
    ids = tuple(served)
    if requested:
        if requested in ids:
            return ModelChoice(requested, "served", ids, requested)
        verdict: Verdict = "not_served" if ids else "unlisted"
        return ModelChoice(None if ids else requested, verdict, ids, requested)
    if len(ids) == 1:
        return ModelChoice(ids[0], "only", ids)
    return ModelChoice(None, "ambiguous" if ids else "none_listed", ids)


# -- error bodies ----------------------------------------------------------------------------------


def api_error_text(error: Any, limit: int | None = None) -> str:
    """An ``openai.APIError``'s server message on one line (a server's own may hold line breaks), its first
    ``limit`` characters where given."""
    return " ".join((error_message(error.body) or error.message).split())[:limit]


def error_message(body: Any) -> str | None:
    """The message of an error body: OpenAI ``{"error": {"message": ...}}``, vLLM ``{"message": ...}``,
    FastAPI ``{"detail": ...}``; None when ``body`` is not one of them."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    for key in ("error", "message", "detail"):
        if body.get(key):
            return str(body[key])
    return None
