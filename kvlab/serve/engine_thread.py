"""Running one request's generation on its own thread, read from the event loop and cancellable.

The embedded engine serves one request at a time.  Requests queue on an ``asyncio.Lock``: waiting
costs no thread, shows in ``kvlab:num_requests_waiting`` and ends at once when the request is
cancelled.  The request that gets the lock runs :meth:`ServedModel.generate` on a daemon thread,
which owns the lock from then on and releases it when it is done.  Cancelling (the client went
away, the server is stopping) sets a flag that generation checks at every attention layer, so the
engine is free again within one layer's time, and the next request can never overlap a request
still running.  A daemon thread never keeps a stopping server alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from kvlab.core.kv_config import KVCacheConfig
from kvlab.serve.generation import Event, ServedModel, Started

_END = object()  # the generation thread is done


class EngineLock:
    """The engine's turn, handed from the event loop to a generation thread."""

    def __init__(self, served: ServedModel):
        self._lock = asyncio.Lock()
        self._metrics = served.metrics

    async def acquire(self) -> None:
        self._metrics.waiting.inc()
        try:
            await self._lock.acquire()
        finally:
            self._metrics.waiting.dec()

    def release(self) -> None:
        """Give the engine back, from the event loop."""
        self._lock.release()

    def release_from_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone, nobody waits
            loop.call_soon_threadsafe(self._lock.release)


class Generation:
    """One request's generation: :meth:`start`, then :meth:`next` until it returns None.
    :meth:`cancel` may be called at any time, and must be once the caller is done with it."""

    def __init__(self, served: ServedModel, lock: EngineLock, prompt: tuple[list[int], list[int]],
                 config: KVCacheConfig, max_tokens: int, stop: Sequence[str], positions: bool = False):
        """``positions``: report the prompt positions each head kept (:class:`kvlab.core.results.KeptPositions`)."""
        self._served, self._lock = served, lock
        self._args = (prompt, config, max_tokens, list(stop), positions)
        self._received = time.perf_counter()
        self._cancel = threading.Event()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def cancel(self) -> None:
        self._cancel.set()

    async def start(self) -> bool:
        """Wait for the engine, then until the prompt is prefilled: False if the server is
        stopping (nothing will come).  Errors of the engine are raised here or by :meth:`next`."""
        loop = asyncio.get_running_loop()
        await self._lock.acquire()
        try:
            threading.Thread(target=self._run, args=(loop,), name="kvlab-generation", daemon=True).start()
        except BaseException:
            self._lock.release_from_thread(loop)
            raise
        return isinstance(await self.next(), Started)

    async def next(self) -> Event | None:
        """The next text delta, then one ``Finished``; None when there is nothing more (after
        ``Finished``, or without it when the server is stopping)."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return None if item is _END else item

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        prompt, config, max_tokens, stop, positions = self._args
        try:
            for event in self._served.generate(prompt, config, max_tokens, stop, self._cancel, self._received,
                                               positions):
                self._put(loop, event)
        except Exception as error:  # raised to the request, which answers 500 and logs it
            self._put(loop, error)
        finally:
            self._put(loop, _END)
            self._lock.release_from_thread(loop)

    def _put(self, loop: asyncio.AbstractEventLoop, item: Any) -> None:
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: stop generating for nobody
            self._cancel.set()
