"""The engine's one thread (:class:`kvlab.serve.engine_thread.EngineThread`): every request's work runs on the
same long-lived thread, whichever thread or coroutine hands it over, and its errors reach the caller."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvlab.serve.engine_thread import EngineThread


def test_work_from_any_thread_runs_on_the_one_engine_thread_in_order():
    engine = EngineThread()
    ran: list[tuple[int, int]] = []

    def work(number: int) -> int:
        ran.append((number, threading.get_ident()))
        return number * 2

    with ThreadPoolExecutor(4) as callers:
        doubled = list(callers.map(lambda n: engine.submit(work, n).result(), range(8)))
    assert doubled == [n * 2 for n in range(8)]
    assert len({ident for _, ident in ran}) == 1 and ran[0][1] != threading.get_ident()
    assert asyncio.run(engine.run(work, 21)) == 42


def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    engine = EngineThread()

    def fail() -> None:
        raise ValueError("no such config")

    with pytest.raises(ValueError, match="no such config"):
        asyncio.run(engine.run(fail))
    assert engine.submit(lambda: "next").result() == "next"
