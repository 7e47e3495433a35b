"""Noticing that a client went away, so that its generation stops and frees the engine.

Before an answer starts (waiting for the engine, prefilling, or generating a whole non-streamed
answer) :func:`until_disconnected` watches the connection; once a stream has started,
Starlette's :class:`StreamingResponse` does, and :class:`EventStream` cancels the generation
however the stream ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from kvlab.serve.middleware import CLIENT_CLOSED, OUTCOME

T = TypeVar("T")


class Cancellable(Protocol):
    """Work a stream reads from: a generation (:class:`kvlab.serve.engine_thread.Generation`), a playground run."""

    def cancel(self) -> None: ...


class ClientGone(Exception):
    """The client closed the connection before its answer."""


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of ``work``, or :class:`ClientGone` as soon as the client disconnects (``work``
    is then cancelled).  Call it only after the request body has been read."""
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait((job, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not job.done():
            job.cancel()
            job.add_done_callback(lambda task: task.cancelled() or task.exception())  # nobody awaits it
    if job.done() and not job.cancelled():
        return job.result()
    raise ClientGone


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(StreamingResponse):
    """Server-sent events read from ``generation`` (a generation or a playground run), which is cancelled however
    the stream ends.
    A stream cut short is counted as 499 (client gone), or 503 when the server is stopping,
    unless the events already recorded another outcome (an error event)."""

    def __init__(self, chunks: AsyncIterator[str], generation: Cancellable, stopping: threading.Event):
        super().__init__(chunks, media_type="text/event-stream")
        self._generation = generation
        self._stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        complete = False

        async def send_tracked(message: Message) -> None:
            nonlocal complete
            await send(message)
            complete = message["type"] == "http.response.body" and not message.get("more_body", False)

        try:
            await super().__call__(scope, receive, send_tracked)
        finally:
            self._generation.cancel()
            if not complete:
                scope.setdefault("state", {}).setdefault(OUTCOME, 503 if self._stopping.is_set() else CLIENT_CLOSED)
