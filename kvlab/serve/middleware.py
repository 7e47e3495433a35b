"""ASGI middleware of ``kvlab serve``: body size limit, last-resort error handling, request counting,
the Host check of a server without a key.

Outermost first: :class:`CountRequests` sees every answer's final status, including those of the
ones inside it; :class:`CatchErrors` turns any exception into a 500 in OpenAI's shape;
:class:`AllowHosts` refuses a request addressed to another name; :class:`LimitBody` refuses a body
over the limit before anything reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvlab.serve.errors import APIError, BodyError, internal_error, shutting_down
from kvlab.serve.metrics import ServerMetrics

#: Key in the request's state (``request.state``) for an outcome that differs from the status
#: sent: a stream that fails or loses its client after its ``200`` went out.
OUTCOME = "kvlab_outcome"
CLIENT_CLOSED = 499  # nginx's status for "the client went away before the answer"


class CountRequests:
    """``kvlab:requests_total{endpoint, status}``: one count per request, under the status it
    ended with.  Paths outside ``endpoints`` are counted as ``other`` (labels stay bounded)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, endpoints: Collection[str]):
        self.app, self.metrics, self.endpoints = app, metrics, frozenset(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        status = 500  # unless a response starts

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
            self.metrics.count(endpoint, state.get(OUTCOME, status))


class CatchErrors:
    """Any exception that escapes the app: logged (see :func:`internal_error`) and answered with a
    500 in OpenAI's shape -- or, if the answer had already started, cut short and counted as 500.
    A request cancelled by uvicorn (still running when its graceful shutdown timed out) gets a 503."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except (Exception, asyncio.CancelledError) as error:
            if isinstance(error, asyncio.CancelledError):
                answer = shutting_down()  # not re-raised: uvicorn would print it as a traceback
            else:
                answer = internal_error(f"{scope['method']} {scope['path']}", error)
            if started:
                scope.setdefault("state", {}).setdefault(OUTCOME, answer.status)
                return
            await answer.response()(scope, receive, send)


class LimitBody:
    """Bodies over ``max_bytes`` get a 413: at once when ``Content-Length`` says so (the body is
    never read; the server drops its bytes as they come), else as soon as the bytes read pass it."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _refusal(self, size: str) -> APIError:
        return APIError(413, f"the request body is {size}; kvlab serve accepts at most {self.max_bytes:,} bytes "
                        "(its --max-body-mb option)", param="body", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refusal(f"{int(declared):,} bytes").response()(scope, receive, send)
            return
        received = 0

        async def receive_counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyError(self._refusal(f"over {self.max_bytes:,} bytes"))
            return message

        await self.app(scope, receive_counted, send)


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port: ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class AllowHosts:
    """Only requests whose ``Host`` is one of ``hosts`` get through; others get a 403.

    A server without an API key trusts whoever can reach it.  A web page cannot reach 127.0.0.1
    directly, but by DNS rebinding (its own name re-resolved to 127.0.0.1) it can, with its own name
    in ``Host``: checking the name closes that door, as Jupyter and vLLM's ``--allowed-hosts`` do."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]):
        self.app, self.hosts = app, frozenset(name.lower() for name in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = host_name(Headers(scope=scope).get("host", ""))
            if name not in self.hosts:
                shown = ", ".join(sorted(self.hosts))
                await APIError(403, f"Host {name!r} is not a name of this server (it answers {shown}): without an "
                               "API key kvlab serve refuses other names, which a web page could send by DNS "
                               "rebinding; add the name with --allowed-host or start it with --api-key-env",
                               param="Host", code="host_not_allowed").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
