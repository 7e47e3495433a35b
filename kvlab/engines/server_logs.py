"""What a launched server's start-up log says: its KV pool, and why it failed to start.

Each engine's own patterns are its module's (:mod:`kvlab.engines.servers`: the pool line as its format
strings write it, its own start-up faults); here are the pool record, the faults every engine shares and the
root cause of a failure.  vLLM states its pool on ``/metrics`` too (read first); older releases, auto-sized
pools and SGLang say it only in the log they write once at start-up.  With tensor parallelism each GPU logs
its own share: the byte counts are those of one GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVPool:
    """A server's KV pool: capacity in tokens, bytes (None if the log did not say), and the line read.

    The engines print sizes with two decimals of GiB, so ``bytes`` is exact to about 5 MiB.
    """

    tokens: int
    bytes: int | None
    source_line: str
    cache_dtype: str | None = None  # the server's --kv-cache-dtype, where it says (vLLM's /metrics)
    #: what the engine chose for the cache by itself and logged, setting -> value (llama.cpp's ``attn_rot_k``: a
    #: Hadamard rotation of quantized keys), recorded with every result: an engine's defaults change between versions
    chosen: Mapping[str, str] = field(default_factory=dict)

    @property
    def chosen_text(self) -> str:
        """``attn_rot_k=1, attn_rot_v=1`` (empty where the engine logged no choice)."""
        return ", ".join(f"{name}={value}" for name, value in self.chosen.items())

    @property
    def bytes_per_token(self) -> float | None:
        if self.bytes is None or self.tokens <= 0:
            return None
        return self.bytes / self.tokens


def line_of(text: str, match: re.Match[str]) -> str:
    """The whole line of ``text`` that ``match`` is in, stripped."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)].strip()


def last_match(pattern: re.Pattern[str], text: str, end: int | None = None) -> re.Match[str] | None:
    """The last match of ``pattern`` in ``text`` (before ``end``): a restarted server's log may hold earlier starts."""
    matches = list(pattern.finditer(text, 0, len(text) if end is None else end))
    return matches[-1] if matches else None


@dataclass(frozen=True)
class StartupFault:
    """A known way for a server to fail at start-up: a pattern in its log, the cause and the fix in words."""

    pattern: re.Pattern[str]
    cause: str
    fix: str


# The faults every engine shares, each cause as the engines word it (vLLM 0.32's CPU build, measured; the GPU
# builds and SGLang by their sources): memory (vllm/v1/worker/cpu_worker.py, torch's OutOfMemoryError, vLLM's
# and SGLang's "no memory left for the cache" errors), a package missing in the server's Python, a port someone
# else holds (the server binds it only after loading the model), a model it cannot load.  An engine's own come
# first (:attr:`kvlab.engines.servers.base.ServingEngine.startup_faults`).
STARTUP_FAULTS = (
    StartupFault(re.compile(r"less than desired CPU memory utilization|OutOfMemoryError|CUDA out of memory|"
                            r"No available memory for the cache blocks|Not enough memory|"
                            r"larger than the available KV cache memory", re.IGNORECASE),
                 "not enough memory for the weights and the KV pool",
                 "size the pool smaller: backend.server.kv_cache_gib (vLLM) or memory_fraction, or max_model_len"),
    StartupFault(re.compile(r"No module named '([\w.]+)'"), "a package is missing in the server's Python",
                 "install it there (kvlab's install scripts make complete venvs: `kvlab engines` names each), or set "
                 "backend.server.python"),
    # (uvicorn, which llama-cpp-python's server runs, words it "[Errno 98] ... address already in use")
    StartupFault(re.compile(r"Address already in use", re.IGNORECASE), "its port is taken by another process",
                 "set backend.server.port = 0 (kvlab picks a free one) or a port nothing else uses"),
    StartupFault(re.compile(r"Invalid repository ID or local directory|does not appear to have a file named|"
                            r"are not supported for now|Model architectures? .* (?:is|are) not supported|"
                            r"Repository Not Found|Unrecognized model"), "it cannot load the model",
                 "give a local transformers directory it supports (a kvlab registry model is served from its "
                 "converted checkpoint), or a model id the host can fetch"),
)


# A worker process's error as the process that waited for it words it: vllm/v1/executor/multiproc_executor.py
# re-raises a worker's start-up failure as RuntimeError(f"Worker failed with error '{e}', please check the
# stack trace above for the root cause"); the text in quotes is the cause.
_WORKER_ERROR = re.compile(r"Worker failed with error '(.+?)'(?:,|$)")
# An exception's own line, as a traceback ends ("ValueError: ...", "torch.OutOfMemoryError: ..."), after any
# log prefix.  Lines that only point elsewhere (the API server's "Engine core initialization failed. See root
# cause above", a worker's "please check the stack trace above") are not causes.
_EXCEPTION_LINE = re.compile(r"\b((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")
_POINTERS = re.compile(r"See root cause above|initialization failed|check the stack trace above|EngineDeadError")


def root_cause(log_text: str) -> str | None:
    """The line of a server's log that names why it failed: a worker's own error, else the first exception
    line that is not a wrapper pointing at another (in a chained traceback the first is the cause)."""
    if worker := last_match(_WORKER_ERROR, log_text):
        return worker.group(1)
    for line in log_text.splitlines():
        match = _EXCEPTION_LINE.search(line.strip())
        if match and not _POINTERS.search(line):
            return f"{match.group(1)}: {match.group(2)}"
    return None


def startup_failure(log_text: str, said: str, faults: tuple[StartupFault, ...] = ()) -> str:
    """Why a server stopped during start-up, in one line naming the cause and the fix, from its log (``faults``:
    the engine's own, tried before the shared ones); else ``said`` (what the launcher saw: an exit code, a health
    check that never passed) and the log's root cause (:func:`root_cause`), else its last error line."""
    for fault in (*faults, *STARTUP_FAULTS):
        if match := last_match(fault.pattern, log_text):
            return f"{fault.cause} ({line_of(log_text, match)[-200:]}); fix: {fault.fix}"
    if cause := root_cause(log_text):
        return f"{said}; root cause: {cause[-300:]}"
    errors = [line.strip() for line in log_text.splitlines() if re.search(r"Error\b|error:", line)]
    return said + (f"; its last error: {errors[-1][-300:]}" if errors else "")
