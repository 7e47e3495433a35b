"""One KV-cache configuration (:class:`KVCacheConfig`) and the sweep grid that expands into many.

Terms (see DESIGN.md): ``ratio`` in an eviction config is kvpress's ``compression_ratio`` -- the
*fraction of context tokens removed*.  The *compression ratio* reported in results is
``baseline bytes / physical bytes`` (``kvlab.compress.accounting``).  The two are never mixed.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvlab.core.formats import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_RESIDUAL_LENGTH,
    FORMATS,
    GROUP_SIZES,
    KEY_AXES,
    MAX_RESIDUAL_LENGTH,
    QUANT_NAMES,
)
from kvlab.core.limits import check_text
from kvlab.core.methods import (
    BUDGET_BOUNDS,
    BUDGETS,
    MAX_KEEP_TOKENS,
    METHOD_NAMES,
    METHODS,
    PARAMS,
    methods_that_decode,
    methods_with,
)
from kvlab.core.space import ConfigSpace, canonical_name, canonical_names

QuantDtype = Literal[QUANT_NAMES]  # type: ignore[valid-type]  # the format registry's names
EvictionMethod = Literal[METHOD_NAMES]  # type: ignore[valid-type]  # "none" + the method registry's names
GroupSize = Literal[GROUP_SIZES]  # type: ignore[valid-type]
KeyAxis = Literal[KEY_AXES]  # type: ignore[valid-type]
ResidualLength = Annotated[int, Field(ge=0, le=MAX_RESIDUAL_LENGTH)]

QUANT_DTYPES: tuple[str, ...] = QUANT_NAMES
EVICTION_METHODS: tuple[str, ...] = METHOD_NAMES

Fraction = Annotated[float, Field(gt=BUDGET_BOUNDS[0], lt=BUDGET_BOUNDS[1])]

#: kvpress's default ``hidden_states_buffer_size``.
DEFAULT_DECODE_BUFFER = 256
#: Bound on a decode policy's counts (an interval, a target, a buffer), far above any context here.
MAX_DECODE_TOKENS = 1 << 20


class DecodePolicy(BaseModel):
    """Compression during generation, as kvpress's ``DecodingPress`` does it: every ``interval``
    forward passes after the prompt (the question's pass counts as one, each generated token as one),
    every full-attention layer's whole cache is scored by the config's eviction method from a buffer
    of the last ``buffer`` passes' hidden states, and cut back to ``target_tokens`` tokens, or to
    ``1 - ratio`` of all tokens seen so far (``CompressionRatioDecodingPress``).  Exactly one of
    ``target_tokens`` and ``ratio``.  Which methods may score during decoding is their registry
    entry's ``decodes``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    interval: Annotated[int, Field(ge=1, le=MAX_DECODE_TOKENS)]
    target_tokens: Annotated[int, Field(ge=1, le=MAX_DECODE_TOKENS)] | None = None
    ratio: Fraction | None = None
    buffer: Annotated[int, Field(ge=0, le=MAX_DECODE_TOKENS)] = DEFAULT_DECODE_BUFFER

    @model_validator(mode="after")
    def _one_target(self) -> DecodePolicy:
        if (self.target_tokens is None) == (self.ratio is None):
            raise ValueError("a decode policy needs exactly one of target_tokens (tokens kept after each "
                             "compression) and ratio (fraction of all tokens seen so far removed)")
        return self

    @property
    def label(self) -> str:
        """``dec64:t256`` (every 64 passes, back to 256 tokens) or ``dec64:r0.5``; ``/b128`` for a buffer
        other than the default."""
        target = f"t{self.target_tokens}" if self.target_tokens is not None else f"r{self.ratio:g}"
        return f"dec{self.interval}:{target}" + (f"/b{self.buffer}" if self.buffer != DEFAULT_DECODE_BUFFER else "")


def _param(name: str) -> Any:
    param = PARAMS[name]
    return Annotated[int, Field(ge=param.low, le=param.high)]


class KVCacheConfig(BaseModel):
    """One KV-cache configuration: quantization of what is kept, after optional token eviction.

    Quantization (``quant``): integer codes of ``int8/int4/int2`` are packed into bytes with a
    scale and zero point per group (KIVI: keys grouped per channel along ``group_size`` tokens,
    values per token along ``group_size`` channels), the last ``residual_length`` tokens stay
    16-bit.  ``fp8_*`` stores one byte per element with a scale per head and block of
    ``group_size`` tokens, and keeps the residual too.  The settings a format reads are its
    registry entry's ``settings`` (:mod:`kvlab.core.formats`); the others are left unused.

    Eviction (``evict``): a kvpress scorer ranks context tokens per head; one budget of the
    budget registry (:data:`kvlab.core.methods.BUDGETS`) is given: ``ratio`` (fraction
    removed, kvpress's ``compression_ratio``), ``keep_fraction`` (top-k: fraction kept),
    ``threshold`` (evict tokens whose normalised score falls below this quantile of all scores of
    the model, so layers may keep different counts) or ``keep_tokens`` (a count per head and layer,
    whatever the context's length).  With a ``decode`` policy the same method
    also compresses during generation (:class:`DecodePolicy`); the prompt's budget is then
    optional (no budget: the prompt is kept whole, as kvpress's ``DecodingPress`` alone does).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = ""
    quant: QuantDtype = "none"
    group_size: GroupSize = DEFAULT_GROUP_SIZE
    residual_length: ResidualLength = DEFAULT_RESIDUAL_LENGTH
    key_axis: KeyAxis = KEY_AXES[0]
    evict: EvictionMethod = "none"
    # The budget registry's kinds (kvlab.core.methods.BUDGETS), one field each:
    ratio: Fraction | None = None
    keep_fraction: Fraction | None = None
    threshold: Fraction | None = None
    keep_tokens: Annotated[int, Field(ge=1, lt=MAX_KEEP_TOKENS)] | None = None
    query_aware: bool = False
    window_size: _param("window_size") = PARAMS["window_size"].default  # type: ignore[valid-type]
    n_sink: _param("n_sink") = PARAMS["n_sink"].default  # type: ignore[valid-type]
    decode: DecodePolicy | None = None  # compression during generation, scored by ``evict``

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return check_text(name)

    @field_validator("quant", "evict", mode="before")
    @classmethod
    def _canonical_name(cls, value: Any) -> Any:
        return canonical_name(value)

    @model_validator(mode="after")
    def _check_budget(self) -> KVCacheConfig:
        budgets = self.budgets_given
        if self.evict == "none":
            if budgets:
                raise ValueError(
                    f"{', '.join(budgets)} given but evict = 'none'; choose an eviction method "
                    f"({', '.join(EVICTION_METHODS[1:])}) or drop the budget"
                )
            if self.query_aware:
                raise ValueError("query_aware = true needs an eviction method (evict)")
            if self.decode is not None:
                raise ValueError(f"decode ({self.decode.label}) needs an eviction method (evict) to score the "
                                 f"cache during generation: one of {', '.join(methods_that_decode())}")
        else:
            accepted = METHODS[self.evict].budgets
            if self.decode is not None:
                self._check_decode(self.decode)
            if self.decode is not None and not budgets:
                return self  # compression during generation only
            if len(budgets) != 1:
                raise ValueError(
                    f"evict = '{self.evict}' needs exactly one budget: "
                    f"{'; '.join(f'{b} ({BUDGETS[b].help})' for b in accepted)}; got {', '.join(budgets) or 'none'}"
                )
            budget = next(iter(budgets))
            if budget not in accepted:
                raise ValueError(
                    f"{budget} works with {', '.join(methods_with(budget))}, not '{self.evict}' "
                    f"(its budgets: {', '.join(accepted)})"
                )
        return self

    def _check_decode(self, decode: DecodePolicy) -> None:
        method = METHODS[self.evict]
        if not method.decodes:
            raise ValueError(f"evict = '{self.evict}' cannot score during generation ({method.decode_refusal}); "
                             f"decode policies work with {', '.join(methods_that_decode())}")
        if "window_size" in method.params and min(decode.interval, decode.buffer) <= self.window_size:
            raise ValueError(
                f"evict = '{self.evict}' scores from its last window_size = {self.window_size} hidden states, so "
                f"decode needs interval and buffer above it (interval = {decode.interval}, buffer = {decode.buffer})"
            )

    @property
    def budgets_given(self) -> dict[str, float]:
        """The budget fields that are set, by kind (validation allows one, and only with a method)."""
        return {name: value for name in BUDGETS if (value := getattr(self, name)) is not None}

    @property
    def is_baseline(self) -> bool:
        return self.quant == "none" and self.evict == "none"

    @property
    def removed_fraction(self) -> float | None:
        """Fraction of context tokens to remove per head, or None (none / threshold: decided by scores)."""
        if self.ratio is not None:
            return self.ratio
        if self.keep_fraction is not None:
            return 1.0 - self.keep_fraction
        return None

    @property
    def label(self) -> str:
        """The config's name, or a readable one derived from its settings."""
        return self.name or describe(self)


def describe(config: KVCacheConfig) -> str:
    """A short, unique-enough label such as ``int4/g64/r64+snapkv:r0.75``: the format with the settings
    its registry entry labels, the method with its budget (the budget registry's prefix)."""
    parts = []
    if config.quant != "none":
        settings = FORMATS[config.quant].settings
        parts.append(config.quant + "".join(s.label(getattr(config, s.field)) for s in settings))
    if config.evict != "none":
        budget = "".join(f"{BUDGETS[name].label}{value if BUDGETS[name].integer else format(value, 'g')}"
                         for name, value in config.budgets_given.items())
        method = f"{config.evict}:{budget}" if budget else config.evict
        decode = f"/{config.decode.label}" if config.decode is not None else ""
        parts.append(method + ("/qa" if config.query_aware else "") + decode)
    return "+".join(parts) or "baseline"


BASELINE = KVCacheConfig(name="baseline")


def decode_options(policies: list[DecodePolicy]) -> tuple[dict[str, Any] | None, ...]:
    """A space's decode axis: no policy, then each of ``policies`` (distinct) as a config's ``decode`` dict."""
    if len(set(policies)) != len(policies):
        raise ValueError("decode lists a policy twice: give each once")
    return (None, *(p.model_dump(exclude_defaults=True, exclude_none=True) for p in policies))


def check_decode_grid(methods: list[str], policies: list[DecodePolicy]) -> None:
    """Each policy must suit each method of a grid that scores during generation (SnapKV's window)."""
    decode_options(policies)
    if policies and not any(m != "none" and METHODS[m].decodes for m in methods):
        raise ValueError(f"decode policies need a method that scores during generation in evict: one of "
                         f"{', '.join(methods_that_decode())}")
    for method in (m for m in methods if m != "none" and METHODS[m].decodes):
        for policy in policies:
            try:
                KVCacheConfig(evict=method, decode=policy)
            except ValidationError as error:  # what a config of the grid would raise
                message = error.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f"decode {policy.label} with {method}: {message}") from None


class SweepGrid(BaseModel):
    """A grid over quantization x eviction method x ratio, expanded into configs (:meth:`space`).

    Each list holds at least one value and none twice, so the grid's points are distinct and
    :meth:`size` counts them without expanding it.  ``group_size`` and ``residual_length`` go to
    the formats that read them (the format registry's ``settings``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    quant: list[QuantDtype] = Field(default=["none"], min_length=1)
    evict: list[EvictionMethod] = Field(default=["none"], min_length=1)
    ratios: list[Fraction] = Field(default=[0.5], min_length=1)
    group_size: GroupSize = DEFAULT_GROUP_SIZE
    residual_length: ResidualLength = DEFAULT_RESIDUAL_LENGTH
    query_aware: bool = False
    #: Decode policies each ratio of a method that scores during generation is also run with
    #: (``kvlab methods`` lists those methods; the others run without).
    decode: list[DecodePolicy] = Field(default=[])

    @field_validator("quant", "evict", mode="before")
    @classmethod
    def _canonical_names(cls, value: Any) -> Any:
        return canonical_names(value)

    @model_validator(mode="after")
    def _check_decode(self) -> SweepGrid:
        check_decode_grid(self.evict, self.decode)
        return self

    @field_validator("quant", "evict", "ratios")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        twice = [str(value) for value, count in Counter(values).items() if count > 1]
        if twice:
            raise ValueError(f"lists {', '.join(twice)} twice: give each value once")
        return values

    def space(self) -> ConfigSpace:
        """The grid as a config space: ``ratios`` are the budget kind ``ratio``; the baseline is one of its points."""
        return ConfigSpace(quant=tuple(self.quant), evict=tuple(self.evict), budget="ratio", budgets=tuple(self.ratios),
                           settings={"group_size": (self.group_size,), "residual_length": (self.residual_length,)},
                           query_aware=self.query_aware, with_baseline=True, decode=decode_options(self.decode))

    def size(self) -> int:
        """Configs :meth:`expand` makes, counted (a method ``none`` takes no ratio)."""
        return self.space().size()

    def expand(self) -> list[KVCacheConfig]:
        return [KVCacheConfig(**point) for point in self.space().points()]


