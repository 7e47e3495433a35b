"""The KV pool a vLLM or SGLang server allocated, read from its start-up log.

Neither engine exposes the pool's size in bytes over HTTP in every version, but both log it once
at start-up.  The patterns below follow the engines' own format strings (cited per pattern); the
log prefixes (``(EngineCore_DP0 pid=N) INFO 10-07 09:13:05 [file.py:L]`` for vLLM,
``[2025-09-28 17:07:10 TP0]`` for SGLang) are ignored.

With tensor parallelism each GPU logs its own share: the byte counts are those of one GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlab.engines.server_flags import check_kind

GIB = 1 << 30

# vllm/v1/core/kv_cache_utils.py: logger.info_once("GPU KV cache size: %s tokens", f"{num_tokens:,}")
# (tokens the whole pool holds, with thousands separators).
_VLLM_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
# vllm/v1/worker/gpu_worker.py Worker.determine_available_memory:
# logger.info("Available KV cache memory: %.2f GiB", ...) in older releases,
# logger.info_once("Available KV cache memory: %s GiB", format_gib(...)) in newer ones.
# It is the memory vLLM gives the pool; the pool fills it up to one block.
_VLLM_MEMORY = re.compile(r"Available KV cache memory: (-?\d+(?:\.\d+)?) GiB")
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
        size = round(float(memory.group(1)) * GIB) if memory else None
        return KVPool(int(tokens.group(1).replace(",", "")), size if size and size > 0 else None,
                      _line_of(log_text, tokens))
    candidates = [m for m in (_last(_SGLANG_MHA, log_text), _last(_SGLANG_MLA, log_text)) if m]
    if not candidates:
        return None
    match = max(candidates, key=lambda m: m.start())
    size = round(sum(float(g) for g in match.groups()[1:]) * GIB)
    return KVPool(int(match.group(1)), size or None, _line_of(log_text, match))  # "0.00 GB": unknown
