"""Running one request's generation on the engine's thread, read from the event loop and cancellable.

The embedded engine serves one request at a time.  Requests queue on an ``asyncio.Lock``: waiting
costs no thread, shows in ``kvlab:num_requests_waiting`` and ends at once when the request is
cancelled.  The request that gets the lock runs :meth:`ServedModel.generate` on the engine's thread
(:class:`EngineThread`), and owns the lock from then on until it is done.  Cancelling (the client went
away, the server is stopping) sets a flag that generation checks at every attention layer, so the
engine is free again within one layer's time, and the next request can never overlap a request
still running.  The engine's thread is a daemon: it never keeps a stopping server alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from kvlab.core.kv_config import KVCacheConfig
from kvlab.serve.generation import Decoding, Event, ServedModel, ServedPrompt, Started

_END = object()  # the generation thread is done


T = TypeVar("T")


class EngineThread:
    """The one thread that runs the engine's work, every request's in turn.

    Why one: PyTorch's CPU kernels run on OpenMP, which gives each thread that starts parallel work a team
    of its own, and libgomp stops its workers' spinning between kernels once its threads outnumber the
    cores.  With a new thread per request, a playground run of 4 configs on 2 cores took 4.9 s instead of
    3.2 s on one long-lived thread (``benchmarks/page_bench.py``'s item; docs/decisions.md).
    """

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="kvlab-engine", daemon=True).start()

    def submit(self, function: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._work.put((future, function, args))
        return future

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the engine's thread, awaited from the event loop."""
        return await asyncio.wrap_future(self.submit(function, *args))

    def _serve(self) -> None:
        while True:
            future, function, args = self._work.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args))
            except BaseException as error:  # handed to whoever waits on the future
                future.set_exception(error)


class EngineLock:
    """The engine's turn, handed from the event loop to the engine's thread (:attr:`thread`)."""

    def __init__(self, served: ServedModel):
        self._lock = asyncio.Lock()
        self._metrics = served.metrics
        self.thread = EngineThread()

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

    def __init__(self, served: ServedModel, lock: EngineLock, prompt: ServedPrompt, config: KVCacheConfig,
                 decoding: Decoding):
        self._served, self._lock = served, lock
        self._args = (prompt, config, decoding)
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
            self._lock.thread.submit(self._run, loop)
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
        prompt, config, decoding = self._args
        try:
            for event in self._served.generate(prompt, config, decoding, self._cancel, self._received):
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
