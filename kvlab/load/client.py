"""The load a config's server is measured under: streamed OpenAI completions, sent as ``vllm bench serve`` sends
them (its ``openai-completions`` backend: one streamed request per prompt, its usage asked for, the time of each
chunk kept), by N clients in a closed loop or at Poisson arrivals in an open loop.

Why not ``vllm bench serve`` itself: it lives in vLLM's venv (kvlab never imports an engine), it draws its own
prompts (random or a dataset file) where kvlab sends the task's, and it reads no server metrics while it runs.
:mod:`kvlab.load.metrics` computes its figures by its definitions, and ``benchmarks/load_bench.py`` runs both on
the same server and load, side by side.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from itertools import count
from typing import Any, TypeVar

import httpx
import numpy as np

from kvlab.load.metrics import LevelResult, RequestRecord, ServerReading, level_result

#: Seconds a request may wait for its next byte: a queue on a 2-core host is long, a dead server is not forever.
READ_TIMEOUT_S = 900.0

T = TypeVar("T")


async def _send(client: httpx.AsyncClient, url: str, body: Mapping[str, Any]) -> RequestRecord:
    """One streamed completion, timed chunk by chunk; a refusal or a broken stream is the record's error."""
    record = RequestRecord(sent_at=time.perf_counter())
    last = record.sent_at
    pieces = 0
    try:
        async with client.stream("POST", url, json=dict(body)) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:300]}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if isinstance(chunk, dict) and chunk.get("error"):
                    record.error = f"the server refused it mid-answer: {str(chunk['error'])[:300]}"
                    return record
                now = time.perf_counter()
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    if record.ttft_s is None:
                        record.ttft_s = now - record.sent_at
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    pieces += 1
                if usage := chunk.get("usage"):
                    record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    record.output_tokens = int(usage.get("completion_tokens") or 0)
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        record.error = f"{type(error).__name__}: {error}"[:300]
        return record
    record.output_tokens = record.output_tokens or pieces
    record.e2el_s = last - record.sent_at  # vllm bench serve: the last chunk's time
    return record


async def _closed(send: Callable[[int], Coroutine[Any, Any, RequestRecord]], clients: int, requests: int
                  ) -> list[RequestRecord]:
    """``clients`` loops, each sending the next request as soon as its last one ended."""
    records: list[RequestRecord] = []
    numbers = count()

    async def client() -> None:
        while (index := next(numbers)) < requests:
            records.append(await send(index))

    await asyncio.gather(*(client() for _ in range(min(clients, requests))))
    return records


async def _open(send: Callable[[int], Coroutine[Any, Any, RequestRecord]], rate: float, requests: int, seed: int
                ) -> list[RequestRecord]:
    """Requests at Poisson arrivals of ``rate`` per second (exponential gaps from ``seed``), whatever is in flight."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=requests)
    tasks: list[asyncio.Task[RequestRecord]] = []
    for index, gap in enumerate(gaps):
        if index:
            await asyncio.sleep(float(gap))
        tasks.append(asyncio.create_task(send(index)))
    return list(await asyncio.gather(*tasks))


def _body(model: str, output_tokens: int, fields: Mapping[str, Any] | None) -> dict[str, Any]:
    """A load request's fields but its prompt: streamed, greedy, its usage asked for, the engine's own fields."""
    return {"model": model, "max_tokens": output_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **(fields or {})}


def _client(clients: int, headers: Mapping[str, str] | None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_S)
    # trust_env=False: a proxy setting of this host must not reroute a load meant for this server
    return httpx.AsyncClient(limits=limits, timeout=timeout, headers=dict(headers or {}), trust_env=False)


def run_level(base_url: str, model: str, prompts: Sequence[str], mode: str, level: float, requests: int,
              output_tokens: int, *, fields: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
              seed: int = 0, watch: Callable[[], Callable[[], ServerReading]] | None = None) -> LevelResult:
    """``requests`` completions of ``output_tokens`` tokens each on ``base_url`` (``.../v1``), the prompts in turn, at
    one level: ``mode`` "closed" with ``level`` clients, or "open" at ``level`` requests per second.  ``fields``:
    the engine's own request fields (``ignore_eos``); ``watch`` starts reading the server and returns what stops it
    and says what it read."""
    if not prompts:
        raise ValueError("a load level needs at least one prompt")
    url = base_url.rstrip("/") + "/completions"
    body = _body(model, output_tokens, fields)
    clients = int(level) if mode == "closed" else requests

    async def drive() -> tuple[list[RequestRecord], float]:
        async with _client(clients, headers) as client:

            def send(index: int) -> Coroutine[Any, Any, RequestRecord]:
                return _send(client, url, body | {"prompt": prompts[index % len(prompts)]})

            started = time.perf_counter()
            records = await (_closed(send, clients, requests) if mode == "closed" else
                             _open(send, level, requests, seed))
            return records, time.perf_counter() - started

    stop = watch() if watch is not None else None
    try:
        records, duration = asyncio.run(drive())
    finally:
        reading = stop() if stop is not None else ServerReading()
    return level_result(mode, level, records, duration, reading)


def run_beside(base_url: str, model: str, prompts: Sequence[str], clients: int, output_tokens: int,
               work: Callable[[], T], *, fields: Mapping[str, Any] | None = None,
               headers: Mapping[str, str] | None = None) -> tuple[T, int, int]:
    """``work`` (blocking: run in a thread) while ``clients`` clients keep the server busy as a closed level's do,
    each sending the next of the prompts as soon as its last ended, until ``work`` returns; what it returned and how
    many load requests completed and failed meanwhile (a client whose request failed stops; those in flight at the
    end are neither).  The load's figures are not kept:
    a level measured with other requests beside it would charge their cost to the config, so
    :meth:`kvlab.engines.openai_compat.OpenAICompatEngine.measure_load` runs this after the level, for the engine's
    noise floor under load."""
    if not prompts:
        raise ValueError("a load needs at least one prompt")
    url = base_url.rstrip("/") + "/completions"
    body = _body(model, output_tokens, fields)
    numbers = count()

    async def drive() -> tuple[T, int, int]:
        async with _client(clients, headers) as client:
            job = asyncio.ensure_future(asyncio.to_thread(work))
            completed = failed = 0

            async def keep_busy() -> None:
                nonlocal completed, failed
                while not job.done():
                    index = next(numbers)
                    record = await _send(client, url, body | {"prompt": prompts[index % len(prompts)]})
                    if record.error is not None:
                        failed += 1
                        return  # a refusing server is not hammered: this client stops
                    completed += 1

            loops = [asyncio.create_task(keep_busy()) for _ in range(clients)]
            try:
                return await job, completed, failed
            finally:  # the requests still in flight are cut: the server drops them
                for loop in loops:
                    loop.cancel()
                await asyncio.gather(*loops, return_exceptions=True)

    return asyncio.run(drive())
