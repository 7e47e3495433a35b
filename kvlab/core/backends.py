"""The backend registry: one declarative entry per place a model can run, kvpress-style.

An entry says what kvlab needs to know before it builds the engine: which KV-cache configs a
client can choose there, whether it launches a server or loads the model in this process,
which spec fields it reads, what the dashboard calls it.  Validation, the CLI's choices, the
form, the tune's search space, the Ray executor's resources and the engine factory read from
here.  Adding a backend is its engine module (with a ``build(spec) -> Engine`` function, or for a
server kvlab launches its :class:`~kvlab.engines.servers.base.ServingEngine`) plus one entry: in
:data:`BACKENDS` here, or, from a package of its own, in the ``kvlab.backends`` entry-point group
(``name = "module:BACKEND"``, naming its :class:`Backend`; vLLM's platform plugins are found the
same way).  A plugin's entries are read at the registry's first use, not at import, so that its
module may import kvlab's own (its ``ServingEngine``'s base class) once kvlab has loaded.

Engines are named, not imported: this module is pure data, so that validating a spec stays
instant and free of torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Literal

#: Which KV-cache configs a client can run on the backend: every format and eviction method
#: (``all``), the server's ``--kv-cache-dtype`` values only (``server_dtypes``: the entry's
#: ``kv_dtypes``), or none (the endpoint decides its own cache).
KVChoice = Literal["all", "server_dtypes", "none"]


@dataclass(frozen=True)
class Backend:
    """One backend.

    ``engine``: the module whose ``build(spec)`` makes the engine; ``description``: one line the form
    shows under the choice.  ``serves_spec_model``: it
    runs the spec's ``model`` (so that model's context limit applies); an OpenAI-compatible
    endpoint serves a model of its own.  ``fields``: the ``[backend]`` fields it reads, beside
    ``kind`` and the request settings every backend has.  ``kv_dtypes`` (a server kvlab launches): kvlab
    format -> the server's ``--kv-cache-dtype`` value, for the formats it stores (``separate_kv``: keys and values each
    in one of them); the rest of what kvlab knows
    of the server is its module's (:mod:`kvlab.engines.servers`), this is what validating a spec reads.
    """

    name: str
    title: str
    engine: str
    description: str
    kv_choice: KVChoice
    launches_server: bool = False
    loads_model_here: bool = False
    serves_spec_model: bool = True
    wants_gpu: bool = False  # a Ray worker of it asks for a GPU whatever its device
    fields: tuple[str, ...] = ()
    kv_dtypes: Mapping[str, str] = field(default_factory=dict)
    separate_kv: bool = False  # the server stores keys and values in types of their own (a config's value_quant)
    #: why a ``[load]`` table cannot run on it (None: it can: a server that batches requests)
    no_load: str | None = None
    #: the ``backend.server`` settings that size its KV pool, which a ``[load]`` budget sizes instead (refused
    #: beside one)
    pool_settings: tuple[str, ...] = ("kv_cache_gib", "memory_fraction")
    #: its server rotates quantized keys and values, and a config's ``rotation = false`` turns that off
    rotates: bool = False
    #: a server kvlab launches: its :class:`~kvlab.engines.servers.base.ServingEngine`, as ``module:attribute``
    server: str | None = None


# vLLM: vllm/config/cache.py `CacheDType = Literal["auto", ..., "fp8", "fp8_e4m3", "fp8_e5m2", ...]`, the type of
#   CacheConfig.cache_dtype, exposed by vllm/engine/arg_utils.py EngineArgs.add_cli_args:
#   cache_group.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"]).  "auto" = model dtype.
# SGLang: python/sglang/srt/server_args.py ServerArgs.kv_cache_dtype, Arg(choices=["auto", "fp8_e5m2",
#   "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16", "fp4_e2m1"]) -- no plain "fp8", so
#   kvlab always names the variant.
_FP8_SERVER_DTYPES = {"none": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
#   Each engine's dtypes of its own scheme (format kind "engine"), named as the engine names them.
_VLLM_DTYPES = _FP8_SERVER_DTYPES | {name: name for name in (
    "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_3bit_nc", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head",
    "nvfp4", "nvfp4_4over6")}
_SGLANG_DTYPES = _FP8_SERVER_DTYPES | {name: name for name in ("mxfp8", "nvfp4", "fp4_mx_block16", "fp4_e2m1")}
# llama.cpp: common/arg.cpp kv_cache_types (--cache-type-k / --cache-type-v): f32, f16, bf16, q8_0, q4_0, q4_1,
#   iq4_nl, q5_0, q5_1; f16 is its default.  kvlab names its block formats as llama.cpp does (kind "ggml").
_LLAMACPP_DTYPES = {"none": "f16"} | {name: name for name in ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")}

_BUILT_IN: dict[str, Backend] = {b.name: b for b in (
    Backend("embedded", "Embedded (PyTorch)", "kvlab.engines.embedded",
            "kvlab's own engine: every format and eviction method, measured bytes, fidelity against the baseline",
            kv_choice="all", loads_model_here=True, fields=("device", "dtype"),
            no_load="kvlab's own engine runs one request at a time and has no serving scheduler: throughput under "
                    "load is measured on a serving engine (backend kind 'vllm', 'sglang' or an OpenAI-compatible "
                    "endpoint); here the experiment page's Capacity section and `kvlab capacity` compute the "
                    "sequences each config fits in a budget"),
    Backend("openai_compat", "OpenAI-compatible endpoint", "kvlab.engines.openai_compat",
            "any server with the OpenAI API (kvlab serve, a running vLLM or SGLang): it decides its own KV cache",
            kv_choice="none", serves_spec_model=False, fields=("base_url", "model_id", "api_key_env")),
    Backend("vllm", "vLLM", "kvlab.engines.launched",
            "kvlab starts a vLLM server per KV dtype (--kv-cache-dtype) and reads its pool",
            kv_choice="server_dtypes", launches_server=True, wants_gpu=True, fields=("model_id", "server"),
            kv_dtypes=_VLLM_DTYPES, server="kvlab.engines.servers.vllm:VLLM"),
    Backend("sglang", "SGLang", "kvlab.engines.launched",
            "kvlab starts an SGLang server per KV dtype (--kv-cache-dtype) and reads its pool",
            kv_choice="server_dtypes", launches_server=True, wants_gpu=True, fields=("model_id", "server"),
            kv_dtypes=_SGLANG_DTYPES, server="kvlab.engines.servers.sglang:SGLANG"),
    Backend("llamacpp", "llama.cpp", "kvlab.engines.launched",
            "kvlab starts a llama.cpp server (llama-cpp-python's) per K and V cache type on the model's GGUF file "
            "and reads its pool; a load phase runs on llama.cpp's own llama-server", kv_choice="server_dtypes",
            launches_server=True, fields=("model_id", "server"),
            kv_dtypes=_LLAMACPP_DTYPES, separate_kv=True, pool_settings=("max_model_len",), rotates=True,
            server="kvlab.engines.servers.llamacpp:LLAMACPP"),
)}

#: The group a package's own backend entries are found in: ``name = "module:attribute"``, naming a :class:`Backend`.
ENTRY_POINT_GROUP = "kvlab.backends"


def _plugged_in() -> Iterator[Backend]:
    """The backends other packages declare (:data:`ENTRY_POINT_GROUP`).  One that cannot be loaded, is no
    :class:`Backend` or takes a built-in's name is left out with one line on standard error saying why: a broken
    plugin must not take kvlab down with it, nor go unnoticed."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            backend = point.load()
        except Exception as error:  # any failure of someone else's import: said and skipped
            print(f"kvlab: backend plugin '{point.name}' ({point.value}) not loaded: "
                  f"{type(error).__name__}: {error}", file=sys.stderr)
            continue
        why = ("it is no kvlab.core.backends.Backend" if not isinstance(backend, Backend)
               else f"its name is '{backend.name}', not its entry point's" if backend.name != point.name
               else "a built-in backend has that name" if backend.name in _BUILT_IN
               else None)
        if why:
            print(f"kvlab: backend plugin '{point.name}' ({point.value}) not loaded: {why}", file=sys.stderr)
            continue
        yield backend


class _Registry(Mapping[str, Backend]):
    """The built-in backends, then the plugged-in ones, read at the first lookup."""

    def __init__(self, built_in: Mapping[str, Backend], plugged_in: Callable[[], Iterator[Backend]]):
        self._built_in, self._plugged_in = built_in, plugged_in
        self._entries: dict[str, Backend] | None = None

    def _all(self) -> dict[str, Backend]:
        if self._entries is None:
            self._entries = dict(self._built_in)
            self._entries.update((backend.name, backend) for backend in self._plugged_in())
        return self._entries

    def __getitem__(self, name: str) -> Backend:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


BACKENDS: Mapping[str, Backend] = _Registry(_BUILT_IN, _plugged_in)


def server_kinds() -> tuple[str, ...]:
    """The servers kvlab launches itself."""
    return tuple(name for name, b in BACKENDS.items() if b.launches_server)


def launched_kinds() -> str:
    """Those kinds as a message names them (``'vllm' / 'sglang'``)."""
    return " / ".join(f"'{kind}'" for kind in server_kinds())


def rotating_kinds() -> str:
    """The backends whose servers have a rotation setting, as a message names them."""
    return " / ".join(f"'{name}'" for name, b in BACKENDS.items() if b.rotates)
