"""The quantization format registry: one declarative entry per KV-cache format kvlab knows.

Everything that lists or checks formats reads :data:`FORMATS`: config validation and labels
(:mod:`kvlab.core.kv_config`), the sweep and tune spaces (:mod:`kvlab.core.space`), the byte accounting
and the quantizer, the dashboard's tables, the blog-format mapping, the form, ``kvlab serve --quant`` and
``kvlab methods``.  Adding a format is one entry here, naming the settings it reads (plus its storage code in
:mod:`kvlab.compress.quantization` if it is a new kind).

Pure data: nothing here imports torch or another kvlab package (the bottom layer, :mod:`kvlab.core`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

FormatKind = Literal["none", "int", "fp8", "ggml", "engine"]
#: The kinds kvlab's own cache stores (:mod:`kvlab.compress`): the embedded engine and ``kvlab serve``.  A
#: ``ggml`` format is llama.cpp's own block format, stored by a llama.cpp server only; an ``engine`` format is a
#: vLLM or SGLang cache dtype of its own scheme (rotated, per-token-head, fp4), stored by that server only.
KVLAB_KINDS: tuple[FormatKind, ...] = ("none", "int", "fp8")

#: Tokens (int keys, fp8 blocks) or channels (int values) sharing one scale; KVCacheConfig.group_size.
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64
#: The most recent tokens kept 16-bit; KVCacheConfig.residual_length (0 to MAX_RESIDUAL_LENGTH).
DEFAULT_RESIDUAL_LENGTH = 64
MAX_RESIDUAL_LENGTH = 8192
KEY_AXES = ("channel", "token")


@dataclass(frozen=True)
class Setting:
    """A ``KVCacheConfig`` field that a format's storage reads, and how a config's label shows it.

    ``prefix``: the label's part for a value (``/g64``), None when the label never shows it;
    ``unlabelled``: values the label leaves out (no residual window: nothing to say).  ``title`` and
    ``help``: its column heading and help (:mod:`kvlab.core.axes`); ``sweep_key`` / ``tune_key``: the
    ``[sweep]`` / ``[tune]`` key that lists its values (None: not varied there); ``column``: shown in the
    configs table.
    """

    field: str
    default: Any
    choices: tuple[Any, ...] = ()  # the values allowed; () for a range (KVCacheConfig bounds it)
    prefix: str | None = None
    unlabelled: tuple[Any, ...] = ()
    title: str = ""
    help: str = ""
    sweep_key: str | None = None
    tune_key: str | None = None
    column: bool = True

    def label(self, value: Any) -> str:
        """The part of a config's label that says ``value`` ("" when the label leaves it out)."""
        return "" if self.prefix is None or value in self.unlabelled else f"/{self.prefix}{value}"


#: Every setting a format may read (kvlab.compress.cache and .accounting), by field.
SETTINGS: dict[str, Setting] = {s.field: s for s in (
    Setting("group_size", DEFAULT_GROUP_SIZE, GROUP_SIZES, prefix="g", title="group size",
            help="values per scale and zero point (fp8: tokens per scale block)", sweep_key="group_size",
            tune_key="group_sizes"),
    Setting("residual_length", DEFAULT_RESIDUAL_LENGTH, prefix="r", unlabelled=(0,), title="residual (tokens)",
            help="the last tokens kept 16-bit (KIVI's residual window)", sweep_key="residual_length",
            tune_key="residual_lengths"),
    Setting("key_axis", KEY_AXES[0], KEY_AXES, prefix="key-", unlabelled=(KEY_AXES[0],),  # KIVI's axis: unsaid
            title="key axis", help="keys grouped per channel (KIVI) or per token", column=False),
)}
_INT_SETTINGS = tuple(SETTINGS.values())
#: fp8 reads its block size and residual window too, but its labels never showed them (a tune left
#: them at their defaults): at the defaults an fp8 label stays ``fp8_e4m3``, off them it says which
#: (``fp8_e4m3/g32/r0``), so that two fp8 configs never share a label.  An unnamed fp8 config off
#: the defaults stored before issue 20 was labelled ``fp8_e4m3``; its rerun gets the new label.
_FP8_SETTINGS = tuple(replace(SETTINGS[name], unlabelled=(SETTINGS[name].default,))
                      for name in ("group_size", "residual_length"))


@dataclass(frozen=True)
class QuantFormat:
    """One KV-cache storage format.

    ``settings``: the ``KVCacheConfig`` fields its storage reads -- what a sweep or a tune varies
    for it (:mod:`kvlab.core.space`), what its label shows and what ``kvlab serve`` is told; a field it
    does not read keeps its default.  What a serving engine calls a format is the engine's own
    (:data:`kvlab.core.backends.BACKENDS`' ``kv_dtypes``, and :mod:`kvlab.engines.servers`).
    """

    name: str
    kind: FormatKind
    bits: int  # stored bits per element of the codes (16 for no quantization)
    storage_dtype: str  # torch dtype name of the stored codes
    description: str
    group_rule: str  # how scales are grouped (shown by `kvlab methods`)
    settings: tuple[Setting, ...] = ()
    fp8_max: float | None = None  # the largest finite value of an fp8 format
    aliases: tuple[str, ...] = ()  # other names accepted wherever a format is named
    blog_names: tuple[str, ...] = ()  # [kv_cache] dtype names of blog-style specs meaning this format
    #: a ggml format's block: (values, bytes) -- the values of one row's run and the bytes that store them with
    #: their scale (and minimum): ggml/src/ggml-common.h's block_q8_0 and the others
    block: tuple[int, int] | None = None
    #: an engine format's code bits per value as its engine documents them (keys' and values' mean; scales
    #: excluded): an estimate, which its server's pool line replaces wherever it runs
    nominal_bits: float | None = None

    @property
    def bits_per_value(self) -> float:
        """Stored bits per element, scales included where they sit inside the block (ggml's: q8_0 is 8.5); an
        engine format's nominal bits."""
        if self.block:
            return self.block[1] * 8 / self.block[0]
        return self.nominal_bits if self.nominal_bits is not None else self.bits

    @property
    def kvlab_stores(self) -> bool:
        """Whether kvlab's own cache stores it (the embedded engine, ``kvlab serve``)."""
        return self.kind in KVLAB_KINDS

    def choices(self, name: str) -> tuple[Any, ...]:
        """The values this format takes for setting ``name``; () when it does not read it."""
        return next((s.choices for s in self.settings if s.field == name), ())

    @property
    def group_sizes(self) -> tuple[int, ...]:
        return self.choices("group_size")


_INT_GROUPS = ("asymmetric min-max, a float16 scale and zero point per group (KIVI): keys per channel over "
               "group_size tokens (or per token, key_axis), values per token over group_size channels; "
               "the last residual_length tokens stay 16-bit")
_FP8_GROUPS = "one float32 scale per head and block of group_size tokens (absolute maximum)"
# ggml/src/ggml-common.h (llama.cpp, as llama-cpp-python 0.3.36 vendors it): QK8_0 = QK4_0 = QK4_1 = QK5_0 = QK5_1 =
# QK4_NL = 32 values per block; block_q8_0 {ggml_half d; int8_t qs[32]} = 34 bytes, block_q4_0 {d; qs[16]} = 18,
# block_q4_1 {d, m; qs[16]} = 20, block_q5_0 {d; qh[4]; qs[16]} = 22, block_q5_1 {d, m; qh[4]; qs[16]} = 24,
# block_iq4_nl {d; qs[16]} = 18 (16 non-uniform levels, kvalues_iq4nl).  Blocks run along a K or V row: one
# token's head_dim x KV heads values in one layer.
_GGML_GROUPS = "llama.cpp's own: blocks of 32 consecutive values of a token's K or V row"
_GGML_HOW = "llama.cpp's {}: per block of 32 values {}"
_ENGINE_GROUPS = "the engine's own scheme (its scales and layout; bytes from its pool line where it runs)"


def _engine(name: str, bits: float, how: str) -> QuantFormat:
    """A serving engine's own cache dtype (kind ``engine``): ``bits``, its documented code bits per value."""
    return QuantFormat(name, "engine", math.floor(bits), "engine", how, _ENGINE_GROUPS, nominal_bits=bits)


# vLLM 0.32 vllm/config/cache.py CacheDType (19 values: auto, float16 and bfloat16 are kvlab's "none", fp8 its
# fp8_e4m3) and SGLang's server_args.py kv_cache_dtype choices.  Bits: vllm/model_executor/layers/quantization/
# turboquant/config.py TQ_PRESETS (key_quant_bits, value_quant_bits), the others' names and docs.  Which attention
# backend stores each is read from the installed engine (kvlab.engines.servers.vllm_menu).
_ENGINE_FORMATS = (
    _engine("fp8_inc", 8, "vLLM's fp8 through Intel Neural Compressor (Intel Gaudi)"),
    _engine("fp8_ds_mla", 8, "vLLM's fp8 MLA cache of DeepSeek's layout (sparse MLA models)"),
    _engine("nvfp4_ds_mla", 4, "vLLM's NVFP4 MLA cache of DeepSeek's layout (sparse MLA models)"),
    _engine("turboquant_k8v4", 6, "vLLM's TurboQuant: fp8 keys, 4-bit values"),
    _engine("turboquant_4bit_nc", 4, "vLLM's TurboQuant: Hadamard-rotated 4-bit Lloyd-Max keys, 4-bit values, norm "
                                     "correction"),
    _engine("turboquant_k3v4_nc", 3.5, "vLLM's TurboQuant: rotated 3-bit keys, 4-bit values, norm correction"),
    _engine("turboquant_3bit_nc", 3, "vLLM's TurboQuant: rotated 3-bit keys and values, norm correction"),
    _engine("ultraquant_4bit", 4, "vLLM's UltraQuant 4-bit cache"),
    _engine("int4_per_token_head", 4, "vLLM's 4-bit integers, one scale per token and head"),
    _engine("int8_per_token_head", 8, "vLLM's 8-bit integers, one scale per token and head"),
    _engine("fp8_per_token_head", 8, "vLLM's fp8, one scale per token and head"),
    _engine("nvfp4", 4, "NVIDIA's fp4 (e2m1) with an fp8 scale per 16 values (vLLM, SGLang)"),
    _engine("nvfp4_4over6", 4, "vLLM's NVFP4 choosing max/6 or max/4 scales per 16 values"),
    _engine("mxfp8", 8, "SGLang's OCP MX fp8: an 8-bit power-of-two scale per 32 values"),
    _engine("fp4_mx_block16", 4, "SGLang's MX fp4 with a scale per 16 values"),
    _engine("fp4_e2m1", 4, "SGLang's fp4 (e2m1)"),
)

FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("none", "none", 16, "bfloat16", "no quantization: 16-bit K and V", "-",
                blog_names=("auto", "fp16", "bf16", "float16", "bfloat16")),
    QuantFormat("int8", "int", 8, "uint8", "8-bit integer codes", _INT_GROUPS, _INT_SETTINGS,
                blog_names=("int8",)),
    QuantFormat("int4", "int", 4, "uint8", "4-bit integer codes, two per byte", _INT_GROUPS, _INT_SETTINGS,
                blog_names=("int4",)),
    QuantFormat("int2", "int", 2, "uint8", "2-bit integer codes, four per byte", _INT_GROUPS, _INT_SETTINGS,
                blog_names=("int2",)),
    QuantFormat("fp8_e4m3", "fp8", 8, "float8_e4m3fn", "fp8, 4 exponent / 3 mantissa bits", _FP8_GROUPS,
                _FP8_SETTINGS, fp8_max=448.0, aliases=("fp8",), blog_names=("fp8", "fp8_e4m3")),
    QuantFormat("fp8_e5m2", "fp8", 8, "float8_e5m2", "fp8, 5 exponent / 2 mantissa bits", _FP8_GROUPS,
                _FP8_SETTINGS, fp8_max=57344.0, blog_names=("fp8_e5m2",)),
    QuantFormat("q8_0", "ggml", 8, "ggml", _GGML_HOW.format("q8_0", "a float16 scale and 8-bit codes"),
                _GGML_GROUPS, block=(32, 34)),
    QuantFormat("q5_1", "ggml", 5, "ggml", _GGML_HOW.format("q5_1", "a float16 scale and minimum, 5-bit codes"),
                _GGML_GROUPS, block=(32, 24)),
    QuantFormat("q5_0", "ggml", 5, "ggml", _GGML_HOW.format("q5_0", "a float16 scale, 5-bit codes"),
                _GGML_GROUPS, block=(32, 22)),
    QuantFormat("q4_1", "ggml", 4, "ggml", _GGML_HOW.format("q4_1", "a float16 scale and minimum, 4-bit codes"),
                _GGML_GROUPS, block=(32, 20)),
    QuantFormat("q4_0", "ggml", 4, "ggml", _GGML_HOW.format("q4_0", "a float16 scale, 4-bit codes"),
                _GGML_GROUPS, block=(32, 18)),
    QuantFormat("iq4_nl", "ggml", 4, "ggml",
                _GGML_HOW.format("iq4_nl", "a float16 scale, 4-bit codes of 16 non-uniform levels"),
                _GGML_GROUPS, block=(32, 18)),
    *_ENGINE_FORMATS,
)}

def format_settings(*names: str) -> tuple[Setting, ...]:
    """The settings formats ``names`` read together (a config's key and value formats), in registry order;
    where an integer format and fp8 both read one, the integer format's label (it always shows it)."""
    merged: dict[str, Setting] = {}
    for name in names:
        for setting in FORMATS[name].settings:
            if setting.field not in merged or FORMATS[name].kind == "int":
                merged[setting.field] = setting
    return tuple(merged[field] for field in SETTINGS if field in merged)


QUANT_NAMES: tuple[str, ...] = tuple(FORMATS)
#: The formats kvlab's own cache stores (the embedded engine, ``kvlab serve``), in registry order.
KVLAB_QUANT_NAMES: tuple[str, ...] = tuple(name for name, f in FORMATS.items() if f.kvlab_stores)
#: Every alias -> its canonical format name.
QUANT_ALIASES: dict[str, str] = {alias: f.name for f in FORMATS.values() for alias in f.aliases}
#: Integer formats: name -> bits.
def ggml_formats_note(own: str) -> dict[str, str]:
    """The note of every llama.cpp block format (kind ``ggml``) for an engine that stores none of them; ``own``:
    what it has instead."""
    return {name: f"{name} is llama.cpp's own block format; {own}" for name, f in FORMATS.items() if f.kind == "ggml"}


INT_BITS: dict[str, int] = {f.name: f.bits for f in FORMATS.values() if f.kind == "int"}
#: fp8 formats: name -> largest finite value.
FP8_MAX: dict[str, float] = {f.name: f.fp8_max for f in FORMATS.values() if f.kind == "fp8" and f.fp8_max}
#: Blog-style [kv_cache] dtype -> format name; bits -> format name (integer formats and 16-bit).
BLOG_DTYPES: dict[str, str] = {blog: f.name for f in FORMATS.values() for blog in f.blog_names}
BLOG_BITS: dict[int, str] = {f.bits: f.name for f in FORMATS.values() if f.kind in ("none", "int")}

