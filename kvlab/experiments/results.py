"""What one (item, config) evaluation produced: the row every report is built from, and the
measurement of the KV cache it ran with."""

from __future__ import annotations

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
    size while the rest of the prompt and the answer were decoded.  ``None`` where the engine
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
                       peak_bytes=data.get("peak_bytes"), estimated=bool(data.get("estimated", False)),
                       source=str(data.get("source") or default_source))
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


@dataclass
class ItemResult:
    """One task item under one KV-cache config.

    The KV columns (``context_tokens`` to ``peak_kv_bytes``, ``kv_bytes_estimated`` and
    ``extra["kv_bytes_source"]``) are one :class:`KVMeasurement` laid flat for the store and the
    reports: build them with :meth:`KVMeasurement.result_fields`, read them back as :attr:`kv`.
    Times are seconds: TTFT = prefill (without any eviction scorer) + this config's own scorer +
    compression + first token, as if the config ran alone.  ``peak_memory_bytes``: on CUDA the
    peak allocated during this config, on CPU the process RSS after it.
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
    def kv(self) -> KVMeasurement:
        """The KV cache this result ran with, as one value."""
        return KVMeasurement(
            context_tokens=self.context_tokens, kept_tokens=self.kept_tokens, kept_fraction=self.kept_fraction,
            baseline_bytes=self.baseline_kv_bytes, physical_bytes=self.physical_kv_bytes,
            analytic_bytes=self.analytic_kv_bytes, peak_bytes=self.peak_kv_bytes, estimated=self.kv_bytes_estimated,
            source=str(self.extra.get("kv_bytes_source")
                       or (NOT_REPORTED if self.physical_kv_bytes is None else "not recorded (an older kvlab)")))
