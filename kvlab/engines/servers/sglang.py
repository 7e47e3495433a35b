"""SGLang: everything kvlab knows of it, from its sources (sgl-project/sglang, 2026 snapshots; each rule cites
the file).  SGLang runs only on a CUDA host here: its tests use a stand-in behind the same HTTP interface, and
``scripts/gpu_check.py`` runs the real one when a GPU is lent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlab.core.errors import ConfigError
from kvlab.engines.server_logs import GIB, KVPool, last_match, line_of
from kvlab.engines.servers.base import FormLabels, MetricNames, ServingEngine, llamacpp_formats_note

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.engines.server_flags import Installed

# python/sglang/srt/mem_cache/memory_pool.py, GB = 1024 * 1024 * 1024 (so "GB" is GiB):
# MHATokenToKVPool.__init__: f"KV Cache is allocated. #tokens: {size}, K size: {k_size / GB:.2f} GB,
#   V size: {v_size / GB:.2f} GB"
# MLATokenToKVPool.__init__: f"KV Cache is allocated. #tokens: {size}, KV size: {kv_size / GB:.2f} GB"
_MHA = re.compile(r"KV Cache is allocated\. #tokens: (\d+), K size: (\d+(?:\.\d+)?) GB, V size: (\d+(?:\.\d+)?) GB")
_MLA = re.compile(r"KV Cache is allocated\. #tokens: (\d+), KV size: (\d+(?:\.\d+)?) GB")
# python/sglang/srt/observability/metrics_collector.py, recent releases: "Memory used by the KV cache pools in
# GB" -- the pool's allocated size in GiB, not what is in use.
POOL_GIB_METRIC = "sglang:kv_cache_memory_usage_gb"


@dataclass(frozen=True)
class SGLangEngine(ServingEngine):
    def check_options(self, options: ServerOptions) -> None:
        if options.kv_cache_gib is not None:
            raise ConfigError("server.kv_cache_gib: SGLang sizes its KV pool by a fraction of GPU memory, not "
                              "bytes; set server.memory_fraction (--mem-fraction-static) instead")
        if options.enforce_eager is not None:
            raise ConfigError("server.enforce_eager is a vLLM flag; SGLang has no such option (remove it)")

    def launch_args(self, model: str, kv_dtypes: tuple[str, str], options: ServerOptions, installed: Installed,
                    dtype: str, served_model_name: str, seed: int) -> list[str]:
        kv_dtype = kv_dtypes[0]  # one --kv-cache-dtype: keys and values alike
        # python/sglang/srt/server_args.py ServerArgs (flags derived from field names): host, port, model_path
        # (alias --model), kv_cache_dtype, mem_fraction_static, context_length, disable_radix_cache,
        # enable_metrics ("Enable log prometheus metrics.", off by default), served_model_name, random_seed.
        argv = ["--model-path", model, "--kv-cache-dtype", kv_dtype]
        if options.memory_fraction is not None:
            argv += ["--mem-fraction-static", str(options.memory_fraction)]
        if options.max_model_len is not None:
            argv += ["--context-length", str(options.max_model_len)]
        if not options.prefix_cache:
            argv.append("--disable-radix-cache")
        return argv + ["--enable-metrics", "--served-model-name", served_model_name, "--random-seed", str(seed)]

    def parse_pool(self, log_text: str) -> KVPool | None:
        candidates = [m for m in (last_match(_MHA, log_text), last_match(_MLA, log_text)) if m]
        if not candidates:
            return None
        match = max(candidates, key=lambda m: m.start())
        size = round(sum(float(g) for g in match.groups()[1:]) * GIB)
        return KVPool(int(match.group(1)), size or None, line_of(log_text, match))  # "0.00 GB": unknown

    def pool_bytes_from_metrics(self, metrics: Mapping[str, float]) -> int | None:
        gib = metrics.get(POOL_GIB_METRIC, 0.0)
        return round(gib * GIB) if gib > 0 else None


_FORMAT_NOTES: Mapping[str, str] = {
    "int8": "its 8-bit KV caches are fp8_e4m3, fp8_e5m2 (kvlab quant fp8_e4m3 / fp8_e5m2) and mxfp8",
    "int4": "its 4-bit KV caches are FP4 (E2M1) formats, not integer codes: nvfp4, fp4_mx_block16, fp4_e2m1",
    "int2": "it has no 2-bit KV cache",
} | llamacpp_formats_note("SGLang's 8-bit caches are fp8_e4m3, fp8_e5m2 and mxfp8")

SGLANG = SGLangEngine(
    kind="sglang",
    # python/sglang/launch_server.py: `if __name__ == "__main__":` prepare_server_args(sys.argv[1:]) (it warns
    # that `sglang serve` is preferred, but keeps the module supported).
    module="sglang.launch_server",
    # python/sglang/srt/entrypoints/http_server.py registers /health and /health_generate on one handler that
    # answers 503 while ServerStatus.Starting; only /health_generate then runs a one-token generation (/health
    # skips it unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION), so it is the one that proves the scheduler works.
    health_path="/health_generate",
    install_hint="on a CUDA host run `pip install 'kvlab[sglang]'`",
    # ServerArgs disable_radix_cache and radix_eviction_policy (RADIX_EVICTION_POLICY_CHOICES = lru, lfu, slru,
    # priority) evict cached prefixes of finished requests, and retraction drops whole requests.
    no_eviction="SGLang does not evict tokens from a sequence's KV cache; its only cache knobs are the radix "
                "prefix cache (--disable-radix-cache, kvlab server.prefix_cache = false; "
                "--radix-eviction-policy evicts cached prefixes of finished requests, not tokens) and "
                "the pool size (--mem-fraction-static, kvlab server.memory_fraction)",
    plain_fp8="SGLang's --kv-cache-dtype rejects it",
    format_notes=_FORMAT_NOTES,
    own_flags={
        "--host": "server.host", "--port": "server.port", "--model-path": "the spec's model",
        "--model": "the spec's model", "--kv-cache-dtype": "the config's quant",
        "--mem-fraction-static": "server.memory_fraction", "--context-length": "server.max_model_len",
        "--disable-radix-cache": "server.prefix_cache", "--enable-metrics": "kvlab (always on)",
        "--served-model-name": "the served model name", "--random-seed": "the spec's seed",
    },
    # server_args.py ServerArgs.api_key / admin_api_key: flags only
    key_flags={flag: "SGLang takes a key only as a flag, so kvlab serves it on 127.0.0.1 without one"
               for flag in ("--api-key", "--admin-api-key")},
    # python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector (--enable-metrics): gauges
    # sglang:token_usage (0..1), sglang:num_running_reqs, sglang:num_queue_reqs, counter
    # sglang:num_retracted_requests_total (requests retracted when the pool ran out: SGLang's preemption).
    metrics=MetricNames(usage=("sglang:token_usage",), preemptions=("sglang:num_retracted_requests_total",),
                        running=("sglang:num_running_reqs",), waiting=("sglang:num_queue_reqs",)),
    # python/sglang/srt/entrypoints/openai/protocol.py ModelCard.owned_by = "sglang"
    owned_by=("sglang",),
    attached_note="accuracy and latency, and fidelity where its OpenAI completions answer prompt_logprobs and "
                  "return_token_ids (kvlab probes it once), not the KV setting: the server chose it at launch",
    form=FormLabels(memory_flag="--mem-fraction-static", context_flag="--context-length", prefix_cache="Radix cache",
                    python_help="kvlab starts `python -m ...` with it (pip install 'kvlab[sglang]' on a CUDA host)"),
)
