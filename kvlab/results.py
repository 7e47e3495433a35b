"""What one (item, config) evaluation produced: the row every report is built from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ItemResult:
    """One task item under one KV-cache config.

    Bytes are of the cache holding the ``context_tokens`` prefix right after compression
    (``physical_kv_bytes`` measured from the tensors, ``analytic_kv_bytes`` from the layout
    formula, ``baseline_kv_bytes`` the same tokens uncompressed at 16-bit);
    ``peak_kv_bytes`` is the largest size measured while the suffix and answer were
    decoded (per layer, summed).  Times are seconds: TTFT = prefill (without any eviction
    scorer) + this config's own scorer + compression + first token, as if the config ran alone.
    ``peak_memory_bytes``: on CUDA the peak allocated during this config, on CPU the process
    RSS after it.  Bytes and kept fractions are ``None`` where the engine cannot know them
    (an OpenAI-compatible endpoint that does not report its cache): never a guess.
    """

    item_id: str
    task: str
    config_name: str
    config: dict[str, Any]
    seed: int
    context_length: int
    depth: float | None
    prompt_tokens: int
    context_tokens: int
    kept_tokens: float | None
    kept_fraction: float | None
    baseline_kv_bytes: int | None
    physical_kv_bytes: int | None
    analytic_kv_bytes: int | None
    compression_ratio: float | None
    peak_kv_bytes: int | None
    generated: str
    answer: str
    output_tokens: int
    ttft_s: float
    tpot_s: float | None
    prefill_s: float
    compress_s: float
    decode_s: float
    peak_memory_bytes: int | None
    score: float | None = None
    nll: float | None = None
    nll_tokens: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    score_s: float | None = None  # this config's own eviction scorer during the prefill
    first_token_s: float | None = None  # the step that produced the first token
    kv_bytes_estimated: bool = False  # True: derived from a server's pool line, not summed from tensors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
