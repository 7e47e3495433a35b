"""One KV-cache configuration (:class:`KVCacheConfig`) and the sweep grid that expands into many.

Terms (see DESIGN.md): ``ratio`` in an eviction config is kvpress's ``compression_ratio`` -- the
*fraction of context tokens removed*.  The *compression ratio* reported in results is
``baseline bytes / physical bytes`` (``kvlab.compress.accounting``).  The two are never mixed.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from kvlab.core.axis import Axis, also_axis, choice_key, field_axes, grid_fields, plain
from kvlab.core.formats import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_RESIDUAL_LENGTH,
    GROUP_SIZES,
    KEY_AXES,
    MAX_RESIDUAL_LENGTH,
    QUANT_NAMES,
    SETTINGS,
    Setting,
    format_settings,
)
from kvlab.core.limits import check_text
from kvlab.core.methods import (
    BUDGET_BOUNDS,
    BUDGETS,
    DEFAULT_ALPHA_SAFEGUARD,
    HEAD_BUDGET_NAMES,
    HEAD_BUDGETS,
    HEADWISE_BUDGETS,
    MAX_KEEP_TOKENS,
    METHOD_NAMES,
    METHODS,
    PARAMS,
    UNIFORM_HEADS,
    methods_headwise,
    methods_that_decode,
    methods_with,
)
from kvlab.core.space import ConfigSpace, canonical_name, canonical_names

QuantDtype = Literal[QUANT_NAMES]  # type: ignore[valid-type]  # the format registry's names
EvictionMethod = Literal[METHOD_NAMES]  # type: ignore[valid-type]  # "none" + the method registry's names
GroupSize = Literal[GROUP_SIZES]  # type: ignore[valid-type]
KeyAxis = Literal[KEY_AXES]  # type: ignore[valid-type]
HeadBudgetName = Literal[HEAD_BUDGET_NAMES]  # type: ignore[valid-type]  # the head-budget registry's names
ResidualLength = Annotated[int, Field(ge=0, le=MAX_RESIDUAL_LENGTH)]

QUANT_DTYPES: tuple[str, ...] = QUANT_NAMES
EVICTION_METHODS: tuple[str, ...] = METHOD_NAMES

Fraction = Annotated[float, Field(gt=BUDGET_BOUNDS[0], lt=BUDGET_BOUNDS[1])]

#: kvpress's default ``hidden_states_buffer_size``.
DEFAULT_DECODE_BUFFER = 256
#: Bound on a layer index or count (far above any model here).
MAX_LAYERS = 1024
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

    interval: Annotated[int, Field(ge=1, le=MAX_DECODE_TOKENS)] = Field(
        title="decode: every (passes)",
        description="Compress every this many forward passes after the prompt (the question's pass counts as one, "
        "each generated token as one).")
    target_tokens: Annotated[int, Field(ge=1, le=MAX_DECODE_TOKENS)] | None = Field(
        default=None, title="decode: to (tokens)",
        description="Tokens each layer keeps after a compression (kvpress's target_size); or give "
        "ratio.")
    ratio: Fraction | None = Field(
        default=None, title="decode: ratio (removed)",
        description="Fraction of all tokens seen so far removed at each compression "
        "(CompressionRatioDecodingPress); or give target_tokens.")
    buffer: Annotated[int, Field(ge=0, le=MAX_DECODE_TOKENS)] = Field(
        default=DEFAULT_DECODE_BUFFER, title="decode: buffer (passes)",
        description="Hidden states of the last passes the scorer reads "
        "(kvpress's hidden_states_buffer_size).")

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


class SkipLayers(BaseModel):
    """Layers whose cache stays 16-bit under a config's quantization (vLLM's ``--kv-cache-dtype-skip-layers``):
    the ``first`` and ``last`` k layers and any listed by index.  Eviction still applies to them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(default=0, title="16-bit: first (layers)",
                                                              description="Keep the first N layers 16-bit.")
    last: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(default=0, title="16-bit: last (layers)",
                                                             description="Keep the last N layers 16-bit.")
    layers: tuple[Annotated[int, Field(ge=0, lt=MAX_LAYERS)], ...] = Field(
        default=(), title="16-bit: layers (indices)", description="Keep these layers 16-bit, by index from 0 "
        "(e.g. 0, 5).")

    @model_validator(mode="after")
    def _some(self) -> SkipLayers:
        if not (self.first or self.last or self.layers):
            raise ValueError("skip_layers names no layer: give first, last (counts) or layers (indices)")
        if len(set(self.layers)) != len(self.layers):
            raise ValueError("skip_layers.layers lists a layer twice")
        return self

    def indices(self, num_layers: int) -> frozenset[int]:
        """The skipped layers of a model of ``num_layers`` layers."""
        return frozenset(range(min(self.first, num_layers))) | frozenset(
            range(max(num_layers - self.last, 0), num_layers)) | frozenset(self.layers)

    def check(self, num_layers: int) -> str | None:
        """Why this cannot apply to a model of ``num_layers`` layers, or None."""
        beyond = sorted(i for i in self.layers if i >= num_layers)
        if beyond:
            return f"skip_layers.layers names layer {beyond[0]}, but the model has {num_layers} (0..{num_layers - 1})"
        if len(self.indices(num_layers)) >= num_layers:
            return (f"skip_layers ({self.label}) keeps every one of the model's {num_layers} layers 16-bit, so "
                    f"nothing would be quantized: name fewer layers")
        return None

    @property
    def label(self) -> str:
        """``16b:f2l2`` (the first and last 2 layers) or ``16b:0,5``, both when both are given."""
        ends = (f"f{self.first}" if self.first else "") + (f"l{self.last}" if self.last else "")
        listed = ",".join(map(str, sorted(self.layers)))
        return "16b:" + "+".join(part for part in (ends, listed) if part)


def _param(name: str) -> Any:
    param = PARAMS[name]
    return Annotated[int, Field(ge=param.low, le=param.high)]


def _setting_axis(name: str) -> Axis:
    """The axis of a format setting, from its entry in the settings registry."""
    setting = SETTINGS[name]
    return Axis(setting.title, setting.help, applies="setting", sweep=setting.sweep_key, tune=setting.tune_key,
                column=setting.column)


def _budget_axis(name: str) -> Axis:
    """The axis of a budget kind, from its entry in the budget registry (a sweep lists ratios alone)."""
    budget = BUDGETS[name]
    return Axis(budget.title, budget.help, applies="evicts", sweep="ratios" if name == "ratio" else None,
                grid_title="Ratios (fraction removed)")


def _param_axis(name: str) -> Axis:
    """The axis of a method parameter, from its entry in the parameter registry (not a column of the table)."""
    return Axis(name.replace("_", " "), PARAMS[name].help, applies="evicts", column=False)


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
    ``heads`` shares each layer's budget out across its KV heads (the head-budget registry,
    :data:`kvlab.core.methods.HEAD_BUDGETS`: AdaKV, CriticalAdaKV), each head keeping at least
    ``alpha_safeguard`` of an equal share; the budget is then the heads' mean.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Each field carries its axis (kvlab.core.axis): the table, the grids' lists, the form and `kvlab serve`
    # are derived from these declarations, in this order.
    name: Annotated[str, Axis(
        "name", "optional; derived from the settings if blank", option=False,
        form_help="The config's name in results, unique; filled from its settings (blank: derived from them). A "
                  "name stays as it is when the settings change: rename the row, or clear its name.")] = Field(
        default="", description="The config's name in results; blank: derived from its settings "
        "(e.g. int4/g64/r64+snapkv:r0.75).")
    quant: Annotated[QuantDtype, Axis(
        "quant", "the keys' and values' format (the keys' alone when value quant is set)", sweep="quant",
        tune="quant", grid_title="Quantization formats")] = Field(
        default="none", description="The storage format of keys and values (of keys alone when value_quant is "
        "set): the format registry's names.")
    value_quant: Annotated[QuantDtype | None, Axis(
        "value quant (if not quant)", "store values in another format than keys, e.g. keys int8 and values int4 "
        "(KIVI: keys need more care); blank: as quant", sweep="value_quant", tune="value_quant",
        grid_title="Value formats (also)")] = Field(
        default=None, description="The values' format where it differs from the keys' (K8V4: quant int8, "
        "value_quant int4); unset: as quant.")
    group_size: Annotated[GroupSize, _setting_axis("group_size")] = Field(
        default=DEFAULT_GROUP_SIZE, description=SETTINGS["group_size"].help)
    residual_length: Annotated[ResidualLength, _setting_axis("residual_length")] = Field(
        default=DEFAULT_RESIDUAL_LENGTH, description=SETTINGS["residual_length"].help)
    key_axis: Annotated[KeyAxis, _setting_axis("key_axis")] = Field(
        default=KEY_AXES[0], description=SETTINGS["key_axis"].help)
    skip_layers: Annotated[SkipLayers | None, also_axis(
        "skip_layers", "16-bit layers", "layers whose cache stays 16-bit under the quantization (vLLM's "
        "--kv-cache-dtype-skip-layers)", "16-bit layer patterns each quantizing config is also run with.",
        label=lambda pattern: f"/{pattern.label}", column_prefix="skipped_", flag_prefix="skip_",
        grid_title="16-bit layer patterns")] = Field(
        default=None, description="Layers whose cache stays 16-bit under the quantization (vLLM's "
        "--kv-cache-dtype-skip-layers).")
    rotation: Annotated[bool | None, also_axis(
        "rotation", "rotation", "a Hadamard rotation of quantized keys and values: true rotates kvlab's own "
        "formats, false turns a serving engine's off (llama.cpp's attn_rot); blank: the engine's default",
        "Rotation settings each quantizing config is also run with on a server that rotates (llama.cpp: false "
        "turns its Hadamard rotation of quantized keys and values off). Empty: the engine's default alone.",
        label=lambda rotated: "/rot" if rotated else "/norot", grid_title="Rotation settings (also)")] = Field(
        default=None, description="A serving engine's Hadamard rotation of quantized keys and values before they are "
        "stored (llama.cpp's attn_rot_k / attn_rot_v, on by default where the head dimension allows): false turns it "
        "off; unset: the engine's default, recorded with every result.")
    evict: Annotated[EvictionMethod, Axis(
        "evict", "the eviction method; the budgets each accepts: `kvlab methods`", sweep="evict", tune="evict",
        grid_title="Eviction methods")] = Field(
        default="none", description="The eviction method (a kvpress scorer; none keeps every token): the method "
        "registry's names, `kvlab methods`.")
    # The budget registry's kinds (kvlab.core.methods.BUDGETS), one field each:
    ratio: Annotated[Fraction | None, _budget_axis("ratio")] = Field(default=None, description=BUDGETS["ratio"].help)
    keep_fraction: Annotated[Fraction | None, _budget_axis("keep_fraction")] = Field(
        default=None, description=BUDGETS["keep_fraction"].help)
    threshold: Annotated[Fraction | None, _budget_axis("threshold")] = Field(
        default=None, description=BUDGETS["threshold"].help)
    keep_tokens: Annotated[Annotated[int, Field(ge=1, lt=MAX_KEEP_TOKENS)] | None, _budget_axis("keep_tokens")] = (
        Field(default=None, description=BUDGETS["keep_tokens"].help))
    query_aware: Annotated[bool, Axis(
        "query-aware", "the question is in the scorer's window (SnapKV's paper); the server sets it itself",
        applies="evicts", sweep="query_aware", tune="query_aware", option=False,
        grid_title="Query-aware eviction")] = Field(
        default=False, description="The question is prefilled with the context and never evicted, so query-driven "
        "scorers see it (SnapKV's observation window).")
    window_size: Annotated[_param("window_size"), _param_axis("window_size")] = Field(  # type: ignore[valid-type]
        default=PARAMS["window_size"].default, description=PARAMS["window_size"].help)
    n_sink: Annotated[_param("n_sink"), _param_axis("n_sink")] = Field(  # type: ignore[valid-type]
        default=PARAMS["n_sink"].default, description=PARAMS["n_sink"].help)
    heads: Annotated[HeadBudgetName, Axis(
        "heads (budget shared by)", "share each layer's budget out across its KV heads (adakv, critical_adakv; "
        "default uniform)", applies="evicts", sweep="heads", tune="heads", grid_title="Head budgets",
        form_help="uniform: every head of a layer keeps the same count; adakv / critical_adakv (kvpress's "
                  "AdaKVPress, CriticalAdaKVPress): a layer's budget goes to the best-scored tokens of all its "
                  "heads, each head keeping at least alpha_safeguard of an equal share. Methods whose scores are "
                  "the same in every head (streaming_llm, tova) keep uniform heads: `kvlab methods`.")] = Field(
        default=UNIFORM_HEADS, description="How a layer's budget is shared out across its KV heads: the head-budget "
        "registry's names (adakv, critical_adakv).")
    alpha_safeguard: Annotated[float, Field(ge=0.0, le=1.0), Axis(
        "head safeguard", "with a head-wise budget: the least share of an equal split each head keeps (kvpress's "
        "alpha_safeguard)", applies="evicts")] = Field(
        default=DEFAULT_ALPHA_SAFEGUARD, description="With a head-wise budget: the least share of an equal split "
        "each head keeps (kvpress's alpha_safeguard).")
    decode: Annotated[DecodePolicy | None, Axis(
        "decode", "compress during generation too (kvpress's DecodingPress)", applies="given", sweep="decode",
        tune="decode", column_prefix="decode_", flag_prefix="decode_", grid_title="Decode policies")] = Field(
        default=None, description="Compress during generation too, scored by evict (kvpress's DecodingPress); "
        "with it the prompt's budget is optional.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return check_text(name)

    @field_validator("quant", "value_quant", "evict", "heads", mode="before")
    @classmethod
    def _canonical_name(cls, value: Any) -> Any:
        return canonical_name(value)

    @model_validator(mode="after")
    def _check_formats(self) -> KVCacheConfig:
        if self.value_quant is not None and self.value_quant == self.quant:
            raise ValueError(f"value_quant = '{self.value_quant}' is quant's format already: give value_quant only "
                             f"when values are stored in another format than keys")
        for axis in also_axes():
            if getattr(self, axis.field) is not None and not self.quantizes:
                raise ValueError(f"{axis.field} applies to quantized keys or values ({axis.field} = "
                                 f"{choice_key(getattr(self, axis.field))}): set quant (or value_quant), or drop it")
        return self

    @model_validator(mode="after")
    def _check_heads(self) -> KVCacheConfig:
        if self.heads == UNIFORM_HEADS:
            if self.alpha_safeguard != DEFAULT_ALPHA_SAFEGUARD:
                raise ValueError(f"alpha_safeguard is read by head-wise budgets only: set heads to one of "
                                 f"{', '.join(HEAD_BUDGET_NAMES[1:])}, or drop alpha_safeguard")
            return self
        method = METHODS.get(self.evict)
        if method is None:
            raise ValueError(f"heads = '{self.heads}' shares an eviction budget out across heads: it needs an "
                             f"eviction method (evict), one of {', '.join(methods_headwise())}")
        if not method.headwise:
            raise ValueError(f"heads = '{self.heads}' cannot share out the scores of evict = '{self.evict}' "
                             f"({method.heads_refusal}); it works with {', '.join(methods_headwise())}")
        if self.decode is not None:
            raise ValueError(f"heads = '{self.heads}' keeps a different count in each head; a decode policy "
                             f"({self.decode.label}) cuts every head to one count: give one or the other")
        if (extra := set(self.budgets_given) - set(HEADWISE_BUDGETS)) or not self.budgets_given:
            raise ValueError(f"heads = '{self.heads}' needs one of {', '.join(HEADWISE_BUDGETS)} as the heads' "
                             f"mean budget; got {', '.join(sorted(extra)) or 'none'}")
        return self

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
            if self.query_aware and METHODS[self.evict].replays_context:
                raise ValueError(f"evict = '{self.evict}' is query-agnostic: it scores the context by having the "
                                 f"model repeat it, the question is not part of it; drop query_aware")
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
        if "n_sink" in method.params and decode.target_tokens is not None and decode.target_tokens <= self.n_sink:
            raise ValueError(
                f"decode.target_tokens = {decode.target_tokens} keeps no more than the n_sink = {self.n_sink} first "
                f"tokens evict = '{self.evict}' always keeps: give target_tokens above n_sink (or a smaller n_sink)"
            )
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
    def value_format(self) -> str:
        """The format values are stored in (``quant``, unless ``value_quant`` says otherwise)."""
        return self.value_quant if self.value_quant is not None else self.quant

    @property
    def quantizes(self) -> bool:
        """Whether keys or values (or both) are quantized."""
        return self.quant != "none" or self.value_format != "none"

    @property
    def settings(self) -> tuple[Setting, ...]:
        """The format settings the key and value formats read."""
        return format_settings(self.quant, self.value_format)

    @property
    def is_baseline(self) -> bool:
        return not self.quantizes and self.evict == "none"

    def for_layer(self, index: int, num_layers: int) -> KVCacheConfig:
        """The config layer ``index`` of ``num_layers`` is stored with: 16-bit in a skipped layer."""
        if self.skip_layers is not None and index in self.skip_layers.indices(num_layers):
            return self.model_copy(update={"quant": "none", "value_quant": None, "skip_layers": None})
        return self

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
    if config.quantizes:
        formats = config.quant if config.value_quant is None else f"k:{config.quant}/v:{config.value_quant}"
        also = "".join(axis.value_label(value) for axis in also_axes()
                       if (value := getattr(config, axis.field)) is not None)
        parts.append(formats + "".join(s.label(getattr(config, s.field)) for s in config.settings) + also)
    if config.evict != "none":
        budget = "".join(f"{BUDGETS[name].label}{value if BUDGETS[name].integer else format(value, 'g')}"
                         for name, value in config.budgets_given.items())
        method = f"{config.evict}:{budget}" if budget else config.evict
        decode = f"/{config.decode.label}" if config.decode is not None else ""
        parts.append(method + _heads_label(config) + ("/qa" if config.query_aware else "") + decode)
    return "+".join(parts) or "baseline"


def _heads_label(config: KVCacheConfig) -> str:
    """``/ada`` (AdaKV), ``/cada0.5`` (CriticalAdaKV, a safeguard other than kvpress's); empty for uniform."""
    if config.heads == UNIFORM_HEADS:
        return ""
    safeguard = f"{config.alpha_safeguard:g}" if config.alpha_safeguard != DEFAULT_ALPHA_SAFEGUARD else ""
    return f"/{HEAD_BUDGETS[config.heads].label}{safeguard}"


def also_axes() -> tuple[Axis, ...]:
    """The axes each quantizing config of a grid is also run with (16-bit layers, rotation): their
    declarations' ``also``."""
    return tuple(axis for axis in field_axes(KVCacheConfig) if axis.also)


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


def check_heads_grid(methods: list[str], heads: list[str], budget: str) -> None:
    """Head budgets of a grid: distinct, and each non-uniform one with a method whose scores it may share
    out and a budget it takes."""
    if len(set(heads)) != len(heads):
        raise ValueError("heads lists a head budget twice: give each once")
    if heads == [UNIFORM_HEADS]:
        return
    shared = [h for h in heads if h != UNIFORM_HEADS]
    if budget not in HEADWISE_BUDGETS:
        raise ValueError(f"heads {', '.join(shared)} need a budget of {', '.join(HEADWISE_BUDGETS)}, not {budget}")
    if not any(m != "none" and METHODS[m].headwise for m in methods):
        raise ValueError(f"heads {', '.join(shared)} share a method's scores out across heads: evict needs one of "
                         f"{', '.join(methods_headwise())}")


def check_query_aware_grid(methods: list[str], query_aware: bool) -> None:
    """A query-aware grid's methods must all read the question (KVzip, query-agnostic, refuses it)."""
    agnostic = [m for m in methods if m != "none" and METHODS[m].replays_context]
    if query_aware and agnostic:
        raise ValueError(f"query_aware = true, but {', '.join(agnostic)} is query-agnostic (it scores the context by "
                         f"having the model repeat it): run it in a grid without query_aware")


def check_value_grid(value_quant: list[str]) -> None:
    """A grid's value formats: distinct."""
    if len(set(value_quant)) != len(value_quant):
        raise ValueError("value_quant lists a format twice: give each once")


def check_also_grid(grid: BaseModel, quant: list[str], value_quant: list[str]) -> None:
    """A grid's lists of the axes each quantizing config is also run with: distinct, and with a format that
    quantizes."""
    for axis in also_axes():
        values = getattr(grid, axis.field)
        keys = [choice_key(v) for v in values]
        if twice := sorted({key for key in keys if keys.count(key) > 1}):
            raise ValueError(f"{axis.field} lists {', '.join(twice)} twice: give each value once")
        if values and all(f == "none" for f in (*quant, *value_quant)):
            raise ValueError(f"{axis.field} applies to quantized keys or values: add a format to quant or "
                             f"value_quant")


def distinct(values: list[Any]) -> list[Any]:
    """``values`` when none is listed twice; else a ValueError naming those that are."""
    twice = [str(value) for value, count in Counter(values).items() if count > 1]
    if twice:
        raise ValueError(f"lists {', '.join(twice)} twice: give each value once")
    return values


class _GridCore(BaseModel):
    """The axes of a grid whose walk is their own (formats, methods, value formats, decode policies, head
    budgets); :class:`GridAxes` adds a list per axis each quantizing config is also run with."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    quant: list[QuantDtype] = Field(default=["none"], min_length=1, description="Quantization formats, each "
                                    "crossed with every method and budget.")
    evict: list[EvictionMethod] = Field(default=["none"], min_length=1, description="Eviction methods, each "
                                        "crossed with every format (none: no eviction).")
    query_aware: bool = Field(default=False, description="Every eviction config of the grid is query-aware.")
    decode: list[DecodePolicy] = Field(
        default=[], description="Decode policies each budget of a method that scores during generation is also run "
        "with (`kvlab methods` lists those methods; the others run without).")
    heads: list[HeadBudgetName] = Field(
        default=[UNIFORM_HEADS], min_length=1, description="Head budgets each budget of a method whose scores may "
        "be shared out across heads is run with (`kvlab methods` lists them; the others keep uniform heads).")
    value_quant: list[QuantDtype] = Field(
        default=[], description="Value formats each format of quant is also run with for its values, its keys in "
        "its own (int4 with int8 values: K4V8). KIVI's finding: keys need more care than values.")

    @field_validator("quant", "value_quant", "evict", "heads", mode="before")
    @classmethod
    def _canonical_names(cls, value: Any) -> Any:
        return canonical_names(value)

    @field_validator("quant", "evict")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        return distinct(values)


if TYPE_CHECKING:
    _GridLists = _GridCore
else:  # a list field per `also` axis of KVCacheConfig, from its declaration
    _GridLists = create_model("_GridLists", __base__=_GridCore, __module__=__name__,
                              **grid_fields(KVCacheConfig, None))


class GridAxes(_GridLists):
    """The axes a sweep's grid and a tune's space list alike (:class:`SweepGrid`, :class:`~kvlab.core.tune_spec.
    TuneSpec`): formats, methods, value formats, decode policies, head budgets, and a list per axis each
    quantizing config is also run with (16-bit layer patterns, rotation: their ``KVCacheConfig`` fields'
    declarations), each list of distinct values, checked together, and walked by one :class:`ConfigSpace`
    (:meth:`config_space`).  They differ in how they give the budget (a sweep lists ratios, a tune a range on a
    step) and the format settings (a sweep one value of each, a tune a list: the fields are derived from the
    settings' axes, :func:`kvlab.core.axis.grid_fields`).
    """

    if TYPE_CHECKING:  # for the type checker, the generated lists that code reads by name (an engine's semantics)
        skip_layers: list[SkipLayers] = Field(default_factory=list)
        rotation: list[bool] = Field(default_factory=list)

    @property
    def budget_kind(self) -> str:
        """The budget kind the space's methods take."""
        return "ratio"

    @model_validator(mode="after")
    def _check_axes(self) -> GridAxes:
        check_decode_grid(self.evict, self.decode)
        check_heads_grid(self.evict, self.heads, self.budget_kind)
        check_value_grid(self.value_quant)
        check_also_grid(self, self.quant, self.value_quant)
        check_query_aware_grid(self.evict, self.query_aware)
        return self

    def config_space(self, budgets: tuple[float, ...], settings: dict[str, tuple[Any, ...]], *,
                     with_baseline: bool, budget_step: float | None = None) -> ConfigSpace:
        """This grid's axes with ``budgets`` of :attr:`budget_kind` and the format ``settings`` offered."""
        also = {axis.field: tuple(plain(v) for v in values) for axis in also_axes()
                if (values := getattr(self, axis.field))}
        return ConfigSpace(quant=tuple(self.quant), evict=tuple(self.evict), budget=self.budget_kind, budgets=budgets,
                           budget_step=budget_step, settings=settings, query_aware=self.query_aware,
                           with_baseline=with_baseline, decode=decode_options(self.decode), heads=tuple(self.heads),
                           value_quant=tuple(self.value_quant), also=also)


if TYPE_CHECKING:
    _SweepSettings = GridAxes
else:  # one value per format setting the sweep lists, from the settings' axes
    _SweepSettings = create_model("_SweepSettings", __base__=GridAxes, __module__=__name__,
                                  **grid_fields(KVCacheConfig, "sweep"))


class SweepGrid(_SweepSettings):
    """A grid over quantization x eviction method x ratio, expanded into configs (:meth:`space`).

    Each list holds at least one value and none twice, so the grid's points are distinct and
    :meth:`size` counts them without expanding it.  ``group_size`` and ``residual_length`` go to
    the formats that read them (the format registry's ``settings``).
    """

    ratios: list[Fraction] = Field(default=[0.5], min_length=1, description="Budgets of every eviction method, "
                                   "as fractions of context tokens removed.")

    @field_validator("ratios")
    @classmethod
    def _distinct_ratios(cls, values: list[Any]) -> list[Any]:
        return distinct(values)

    def space(self) -> ConfigSpace:
        """The grid as a config space: ``ratios`` are the budget kind ``ratio``; the baseline is one of its points."""
        settings = {s.field: (getattr(self, s.sweep_key),) for s in SETTINGS.values() if s.sweep_key is not None}
        return self.config_space(tuple(self.ratios), settings, with_baseline=True)

    def size(self) -> int:
        """Configs :meth:`expand` makes, counted (a method ``none`` takes no ratio)."""
        return self.space().size()

    def expand(self) -> list[KVCacheConfig]:
        return [KVCacheConfig(**point) for point in self.space().points()]
