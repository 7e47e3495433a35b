"""What one (item, config) evaluation produced: the row every report is built from, and the
measurement of the KV cache it ran with."""

from __future__ import annotations

import base64
import math
from dataclasses import asdict, dataclass, field
from typing import Any

#: Where a :class:`KVMeasurement` came from (``source``); launched servers add their log line.
MEASURED_EMBEDDED = "measured by the embedded engine"
MEASURED_SERVED = "kvlab serve (measured)"
NOT_REPORTED = "not reported by the endpoint"


@dataclass(frozen=True)
class KVMeasurement:
    """The KV cache that held one prompt: the only spelling of the KV bytes in kvlab.

    Bytes are of the cache holding the ``context_tokens`` prefix right after compression
    (``physical_bytes`` measured from the tensors, ``analytic_bytes`` from the layout formula,
    ``baseline_bytes`` the same tokens uncompressed at 16-bit); ``peak_bytes`` is the largest
    size while the rest of the prompt and the answer were decoded, ``final_bytes`` its size at the
    end.  ``None`` where the engine
    cannot know (an endpoint that does not report its cache): never a guess.  ``estimated``: the
    bytes are derived (a server's pool bytes per token times the tokens), not summed from tensors;
    ``source`` says where they came from, in words a report can show.

    :meth:`to_dict` is also the ``kv_cache`` block ``kvlab serve`` adds to each response.
    """

    context_tokens: int
    kept_tokens: float | None = None
    kept_fraction: float | None = None
    baseline_bytes: int | None = None
    physical_bytes: int | None = None
    analytic_bytes: int | None = None
    peak_bytes: int | None = None
    final_bytes: int | None = None  # the cache once the answer was decoded (a decode policy cuts it)
    estimated: bool = False
    source: str = NOT_REPORTED

    @property
    def compression_ratio(self) -> float | None:
        """Baseline over physical bytes (infinite for an empty cache); None when either is unknown."""
        if self.baseline_bytes is None or self.physical_bytes is None:
            return None
        return self.baseline_bytes / self.physical_bytes if self.physical_bytes else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], default_source: str = NOT_REPORTED) -> KVMeasurement:
        """Read :meth:`to_dict`'s shape; ``default_source`` for a sender that does not say (``kvlab
        serve`` before it sent ``source``).  Unknown keys (``config``, timings) are ignored.
        Raises ``ValueError`` for a dict that is not a measurement."""
        try:
            return cls(context_tokens=int(data["context_tokens"]), kept_tokens=data.get("kept_tokens"),
                       kept_fraction=data.get("kept_fraction"), baseline_bytes=data.get("baseline_bytes"),
                       physical_bytes=data.get("physical_bytes"), analytic_bytes=data.get("analytic_bytes"),
                       peak_bytes=data.get("peak_bytes"), final_bytes=data.get("final_bytes"),
                       estimated=bool(data.get("estimated", False)), source=str(data.get("source") or default_source))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a KV-cache measurement ({type(error).__name__}: {error}): {data!r:.200}") from None

    def result_fields(self) -> dict[str, Any]:
        """The flat :class:`ItemResult` fields (the store's columns) this measurement fills:
        ``ItemResult(..., **measurement.result_fields())``."""
        return {"context_tokens": self.context_tokens, "kept_tokens": self.kept_tokens,
                "kept_fraction": self.kept_fraction, "baseline_kv_bytes": self.baseline_bytes,
                "physical_kv_bytes": self.physical_bytes, "analytic_kv_bytes": self.analytic_bytes,
                "compression_ratio": self.compression_ratio, "peak_kv_bytes": self.peak_bytes,
                "kv_bytes_estimated": self.estimated, "extra": {"kv_bytes_source": self.source}}


@dataclass(frozen=True)
class CacheLayout:
    """Where a compressed prompt cache's memory is, right after compression: the tokens each KV head of
    each layer holds (``kept[layer][head]``: a head-wise budget gives heads different counts) and each
    layer's measured bytes.  Stored in a result's ``extra["cache_layout"]`` (the embedded engine only)."""

    kept: tuple[tuple[int, ...], ...]
    bytes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kept": [list(heads) for heads in self.kept], "bytes": list(self.bytes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CacheLayout:
        return cls(tuple(tuple(int(n) for n in heads) for heads in data["kept"]), tuple(int(b) for b in data["bytes"]))


#: How :class:`KeptPositions` sends each head's positions.
POSITIONS_ENCODING = "bitmap-lsb-base64"


@dataclass(frozen=True)
class KeptPositions:
    """Which prompt positions each KV head of each layer holds right after compression (``kept[layer][head]``,
    sorted positions in ``[0, tokens)``): what a token map draws.

    Sent (:meth:`to_dict`, ``kvlab serve``'s ``kv_cache.kept_positions``) as one bitmap per layer and head:
    ``ceil(tokens / 8)`` bytes, bit ``i % 8`` (least significant first) of byte ``i // 8`` set where position
    ``i`` is kept, base64 -- 30 layers x 3 heads of a 1K-token prompt take about 15 KB.
    """

    tokens: int
    kept: tuple[tuple[tuple[int, ...], ...], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "encoding": POSITIONS_ENCODING,
                "layers": [[_bitmap(positions, self.tokens) for positions in heads] for heads in self.kept]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeptPositions:
        """Read :meth:`to_dict`'s shape; ``ValueError`` for another encoding or a bitmap of the wrong size."""
        if data.get("encoding") != POSITIONS_ENCODING:
            raise ValueError(f"kept positions encoded as {data.get('encoding')!r}, not {POSITIONS_ENCODING!r}")
        tokens = int(data["tokens"])
        return cls(tokens, tuple(tuple(_positions(bitmap, tokens) for bitmap in heads) for heads in data["layers"]))

    def share(self) -> list[float]:
        """For each position, the share of layers x heads that kept it."""
        counts = [0] * self.tokens
        heads = 0
        for layer in self.kept:
            for positions in layer:
                heads += 1
                for position in positions:
                    counts[position] += 1
        return [count / heads for count in counts] if heads else []


def _bitmap(positions: tuple[int, ...], tokens: int) -> str:
    bits = bytearray((tokens + 7) // 8)
    for position in positions:
        bits[position >> 3] |= 1 << (position & 7)
    return base64.b64encode(bytes(bits)).decode("ascii")


def _positions(bitmap: str, tokens: int) -> tuple[int, ...]:
    bits = base64.b64decode(bitmap, validate=True)
    if len(bits) != (tokens + 7) // 8:
        raise ValueError(f"a bitmap of {len(bits)} bytes for {tokens} positions")
    return tuple(i for i in range(tokens) if bits[i >> 3] >> (i & 7) & 1)


#: Most points of a cache's trace over a generation kept in a result (first, last and peak always).
TRACE_POINTS = 64


@dataclass(frozen=True)
class GenerationKV:
    """The cache over one generation, measured after each forward pass: ``tokens`` seen so far
    (prompt and fed answer tokens, evicted ones included) against its ``bytes``, thinned to at most
    :data:`TRACE_POINTS` points.  ``final_baseline_bytes``: the denominator of :attr:`final_ratio`,
    the uncompressed 16-bit cache of the same ``final_tokens`` tokens.  ``bytes_per_token``: the final
    cache over the tokens it has seen (an uncompressed cache: its bytes per token at 16-bit)."""

    tokens: tuple[int, ...]
    bytes: tuple[int, ...]
    final_tokens: int
    final_bytes: int
    final_baseline_bytes: int
    peak_bytes: int
    bytes_per_token: float

    @property
    def final_ratio(self) -> float:
        return self.final_baseline_bytes / self.final_bytes if self.final_bytes else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": list(self.tokens), "bytes": list(self.bytes),
                "final_ratio": self.final_ratio}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationKV:
        return cls(tuple(data["tokens"]), tuple(data["bytes"]), int(data["final_tokens"]), int(data["final_bytes"]),
                   int(data["final_baseline_bytes"]), int(data["peak_bytes"]), float(data["bytes_per_token"]))

    @classmethod
    def from_trace(cls, trace: list[tuple[int, int]], baseline_bytes: int) -> GenerationKV:
        """``trace``: (tokens seen, bytes) after each pass; ``baseline_bytes``: the uncompressed cache
        of the last point's tokens."""
        if not trace:
            raise ValueError("a generation's trace needs at least the prompt's pass")
        peak = max(range(len(trace)), key=lambda i: trace[i][1])
        step = max(1, -(-len(trace) // TRACE_POINTS))
        kept = sorted({*range(0, len(trace), step), peak, len(trace) - 1})
        last_tokens, last_bytes = trace[-1]
        return cls(tuple(trace[i][0] for i in kept), tuple(trace[i][1] for i in kept), last_tokens, last_bytes,
                   baseline_bytes, trace[peak][1], last_bytes / last_tokens if last_tokens else 0.0)


#: The key of a result's ``extra`` that holds its item's :attr:`kvlab.core.items.TaskItem.content_hash`.
ITEM_HASH = "item_hash"

#: What a config was teacher-forced on (:attr:`Fidelity.teacher`).
TEACHER_BASELINE_OUTPUT = "the baseline's greedy output"
TEACHER_CONTINUATION = "the reference continuation"
#: The sampled estimator (a server's prompt log-probabilities): ``kl[i]`` is log p(y_i) - log q(y_i) for a token
#: y_i the baseline sampled at temperature 1, an unbiased estimate of position i's KL (it can be negative);
#: :mod:`kvlab.engines.server_fidelity`.
TEACHER_BASELINE_SAMPLE = "the baseline's sampled continuation (estimated KL)"
#: The keys of a baseline's ``extra`` on a server that holds the engine's noise floor on its item (a
#: :class:`Fidelity` of the baseline against itself scored afresh, :mod:`kvlab.analysis.noise_floor`), or why not.
NOISE_FLOOR_KEY = "noise_floor"
NOISE_FLOOR_NOTE_KEY = "noise_floor_note"


@dataclass(frozen=True)
class Fidelity:
    """How closely one config's next-token distributions follow the baseline's on one item.

    The config is *teacher-forced* on the baseline's tokens (its greedy output, or a perplexity
    item's continuation), so position ``i`` of both sees the same tokens: ``kl[i]`` is
    KL(p_baseline || p_config) in nats at that position, ``agree[i]`` whether both put their
    highest probability on the same token.  ``first_divergence``: the first position where they do
    not (where the config's own greedy output leaves the baseline's), None when they never do.
    The tokens of one item are not independent: every interval over fidelity takes the item as its
    unit (:mod:`kvlab.analysis.fidelity`).
    """

    kl: tuple[float, ...]
    agree: tuple[bool, ...]
    teacher: str = TEACHER_BASELINE_OUTPUT

    def __post_init__(self) -> None:
        if len(self.kl) != len(self.agree) or not self.kl:
            raise ValueError(f"a fidelity needs one KL and one agreement per token (got {len(self.kl)} and "
                             f"{len(self.agree)})")

    @property
    def tokens(self) -> int:
        return len(self.kl)

    @property
    def mean_kl(self) -> float:
        return math.fsum(self.kl) / len(self.kl)

    @property
    def max_kl(self) -> float:
        return max(self.kl)

    @property
    def agreement(self) -> float:
        """Share of positions with the same top-1 token."""
        return sum(self.agree) / len(self.agree)

    @property
    def first_divergence(self) -> int | None:
        return next((i for i, same in enumerate(self.agree) if not same), None)

    def to_dict(self) -> dict[str, Any]:
        """Every per-token figure, and the item's summary beside them (for exports and the store)."""
        return {"kl": list(self.kl), "agree": list(self.agree), "teacher": self.teacher, "tokens": self.tokens,
                "mean_kl": self.mean_kl, "max_kl": self.max_kl, "agreement": self.agreement,
                "first_divergence": self.first_divergence}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fidelity:
        return cls(kl=tuple(float(v) for v in data["kl"]), agree=tuple(bool(v) for v in data["agree"]),
                   teacher=str(data.get("teacher", TEACHER_BASELINE_OUTPUT)))


@dataclass
class ItemResult:
    """One task item under one KV-cache config.

    The KV columns (``context_tokens`` to ``peak_kv_bytes``, ``kv_bytes_estimated`` and
    ``extra["kv_bytes_source"]``) are one :class:`KVMeasurement` laid flat for the store and the
    reports: build them with :meth:`KVMeasurement.result_fields`, read them back as :attr:`kv`.
    Times are seconds: TTFT = prefill (without any eviction scorer) + this config's own scorer +
    compression + first token, as if the config ran alone.  ``peak_memory_bytes``: on CUDA the
    peak allocated during this config, on CPU the process RSS after it.  ``extra["fidelity"]``:
    the config's :class:`Fidelity` against the baseline (read it as :attr:`fidelity`).
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

    @property
    def fidelity(self) -> Fidelity | None:
        """Against the baseline, where the engine measured it (the embedded engine; not the baseline itself)."""
        data = self.extra.get("fidelity")
        return Fidelity.from_dict(data) if data else None

    @property
    def kv(self) -> KVMeasurement:
        """The KV cache this result ran with, as one value."""
        return KVMeasurement(
            context_tokens=self.context_tokens, kept_tokens=self.kept_tokens, kept_fraction=self.kept_fraction,
            baseline_bytes=self.baseline_kv_bytes, physical_bytes=self.physical_kv_bytes,
            analytic_bytes=self.analytic_kv_bytes, peak_bytes=self.peak_kv_bytes, estimated=self.kv_bytes_estimated,
            source=str(self.extra.get("kv_bytes_source")
                       or (NOT_REPORTED if self.physical_kv_bytes is None else "not recorded (an older kvlab)")))
