"""Errors of ``kvlab serve``, all answered in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}`` with the matching HTTP status.

An unexpected exception is a 500 whose message names only its type; the traceback goes to the
serve log (``kvlab-serve.log`` in :func:`kvlab.paths.log_dir`, see :mod:`kvlab.errlog`) and the server's
terminal gets one line saying where -- or the traceback too with ``KVLAB_DEBUG=1``.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kvlab.errlog import debug_enabled, log_details, one_line, redact

LOG_NAME = "serve"
#: The tags of the requests' tagged unions (the playground's item kinds), left out of an error's location.
UNION_TAGS = frozenset({"generated", "own"})


class APIError(Exception):
    """An error answered in OpenAI's shape with HTTP status ``status``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content=self.body())


class BodyError(HTTPException):
    """An :class:`APIError` raised while FastAPI reads the body, which turns any exception but an
    ``HTTPException`` into a 400."""

    def __init__(self, error: APIError):
        super().__init__(error.status, error.message)
        self.error = error


def error_type(status: int) -> str:
    """OpenAI's error type for an HTTP status."""
    return {401: "authentication_error", 404: "not_found_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error")


def shutting_down() -> APIError:
    return APIError(503, "kvlab serve is shutting down; send the request again once it is back",
                    type_="server_error", code="shutting_down")


def internal_error(where: str, error: BaseException) -> APIError:
    """Log ``error`` (raised while answering ``where``, e.g. ``POST /v1/completions``) and return
    the 500 to answer: its message names the error's type, never its traceback or text."""
    path = log_details(LOG_NAME, where, error)
    if debug_enabled():
        traceback.print_exception(error, file=sys.stderr)
    print(f"error: internal error in {where} ({type(error).__name__}: {one_line(redact(str(error)), 160)}); "
          f"details in {path}", file=sys.stderr, flush=True)
    return APIError(500, f"internal error ({type(error).__name__}) in kvlab serve; the details are in its log",
                    type_="server_error")


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-shaped answers for kvlab's own errors, invalid requests and Starlette's HTTP errors
    (unknown path, wrong method, body too large)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            reason = first.get("ctx", {}).get("error", "decode error")
            return APIError(400, f"the body is not valid JSON ({reason})", param="body").response()
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body" and p not in UNION_TAGS) or "body"
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        return APIError(400, f"{where}: {message}", param=where).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
        if isinstance(error, BodyError):
            return error.error.response()
        status = 400 if error.status_code == 422 else error.status_code
        param = "body" if status == 400 else None  # FastAPI's own 400: a body it could not parse
        body = APIError(status, str(error.detail), type_=error_type(status), param=param).body()
        return JSONResponse(status_code=status, content=body, headers=error.headers)
