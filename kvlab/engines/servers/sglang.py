"""SGLang: everything kvlab knows of it, from its sources (sgl-project/sglang, 2026 snapshots; each rule cites
the file).  SGLang runs only on a CUDA host here: its tests use a stand-in behind the same HTTP interface, and
``scripts/gpu_check.py`` runs the real one when a GPU is lent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.core.errors import ConfigError
from kvlab.core.formats import ggml_formats_note
from kvlab.core.units import GIB
from kvlab.engines.server_logs import KVPool, last_match, line_of
from kvlab.engines.servers.base import FormLabels, MetricNames, ScoringAPI, ScoringUnsupported, ServingEngine

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.engines.servers.installs import Installed

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

    def with_budget(self, options: ServerOptions, budget_bytes: int, bytes_per_token: float | None
                    ) -> tuple[ServerOptions, list[str]]:
        """``--max-total-tokens`` (server_args.py ServerArgs.max_total_tokens: "the maximum number of tokens in the
        memory pool"): the budget over this config's bytes per token, so a compressed cache holds more tokens."""
        if bytes_per_token is None:
            raise ConfigError("SGLang sizes its KV pool in tokens, and kvlab reads a config's bytes per token from "
                              "a local model's geometry only: run load.kv_budget_mib on a registry or local model")
        return options, ["--max-total-tokens", str(int(budget_bytes // bytes_per_token))]

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


class SGLangGenerate(ScoringAPI):
    """The sampled fidelity estimator through SGLang's native ``/generate``: its OpenAI completions take no
    ``prompt_logprobs`` (python/sglang/srt/entrypoints/openai/protocol.py CompletionRequest has ``echo`` and
    ``logprobs``, by token text, and ``return_token_ids``; pydantic drops unknown fields, so a ``prompt_logprobs``
    field is ignored, not refused).

    python/sglang/srt/entrypoints/http_server.py: ``@app.api_route("/generate", methods=["POST", "PUT"])`` takes a
    GenerateReqInput body and answers a non-streamed request with the tokenizer manager's output dict, ``{"text",
    "output_ids", "meta_info"}``; a ValueError is a 400 ``{"error": {"message": ...}}`` (``_create_error_response``).
    python/sglang/srt/managers/io_struct.py GenerateReqInput: ``text`` or ``input_ids`` (one prompt each);
    ``sampling_params`` (a dict of SamplingParams' fields); ``return_logprob``; ``logprob_start_len`` (where the
    prompt's log-probabilities start; default -1: the output tokens' only); ``top_logprobs_num`` (top tokens per
    position); ``return_text_in_logprobs`` (default False: each entry's text is None).
    python/sglang/srt/managers/tokenizer_manager.py TokenizerManager.add_logprob_to_meta_info /
    detokenize_logprob_tokens / detokenize_top_logprobs_tokens: ``meta_info["input_token_logprobs"]`` and
    ``["output_token_logprobs"]`` hold one ``[logprob, token_id, text]`` per position; ``["input_top_logprobs"]``
    and ``["output_top_logprobs"]`` one entry per position, None or a list of ``top_logprobs_num``
    ``[logprob, token_id, text]`` (best first).
    python/sglang/srt/managers/scheduler_output_processor_mixin.py add_input_logprob_return_values (later releases:
    the scheduler's logprob result processor, ``_process_input_token_logprobs`` / ``_process_input_top_logprobs``):
    the input entries cover ``origin_input_ids[logprob_start_len:]`` and their logprobs are ``[None] +
    computed[:-1]`` (top lists likewise): the entry at ``logprob_start_len`` holds None, and each later entry the
    log-probability of its token given all before it.
    python/sglang/srt/managers/schedule_batch.py Req (``_compute_max_prefix_len``): with ``return_logprob`` the radix
    cache's matched prefix is cut at ``logprob_start_len``, so a scoring request that starts at the prompt's last
    token reuses the prompt's cached blocks (the accuracy request's, stored in the server's KV dtype).
    """

    path = "/generate"
    reads = "SGLang's /generate input_token_logprobs"

    def sample_body(self, prompt: str, max_tokens: int, seed: int) -> dict[str, Any]:
        # python/sglang/srt/sampling/sampling_params.py SamplingParams: temperature 1, top_p 1, top_k -1 (the whole
        # vocabulary), min_p 0 and neutral penalties are plain sampling; given here because a server's
        # --preferred-sampling-params fills the fields a request leaves out (tokenizer_manager.py
        # _create_tokenized_object).  sampling_seed seeds the draw only under --enable-deterministic-inference
        # (python/sglang/srt/sampling/sampling_batch_info.py reads it then alone); the reference records the tokens
        # it drew, so nothing depends on repeating them.
        # logprob_start_len 0: input_token_logprobs then name every prompt token (the prompt's ids as the server
        # tokenized them, which the scoring requests send back); it also costs the baseline's server one pass over
        # the whole prompt per item, outside its prefix cache.
        return {"text": prompt, "sampling_params": {
                    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                    "frequency_penalty": 0.0, "presence_penalty": 0.0, "max_new_tokens": max_tokens,
                    "sampling_seed": seed},
                "return_logprob": True, "logprob_start_len": 0}

    def sampled(self, answer: Any) -> tuple[list[int], list[int]]:
        meta = _meta_info(answer)
        prompt_ids = _entry_ids(meta, "input_token_logprobs", "its /generate answers hold no prompt token ids")
        # meta_info["prompt_tokens"]: the prompt's length (tokenizer_manager.py _handle_batch_output); a server that
        # started the log-probabilities later than asked would leave the prompt's ids short
        counted = meta.get("prompt_tokens")
        if isinstance(counted, int) and counted != len(prompt_ids):
            raise ScoringUnsupported(f"its input_token_logprobs name {len(prompt_ids)} of the prompt's {counted} "
                                     "tokens (logprob_start_len 0)")
        return prompt_ids, _entry_ids(meta, "output_token_logprobs", "its /generate answers hold no output token ids")

    def score_body(self, prompt_ids: Sequence[int], tokens: Sequence[int]) -> dict[str, Any]:
        # One greedy token (the health check's own request shape: http_server.py health_generate); the log-
        # probabilities start at the prompt's last token, whose entry is None, so the ones after it are the
        # continuation's.
        return {"input_ids": [*prompt_ids, *tokens], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1, "top_logprobs_num": 1}

    def scored(self, answer: Any, prompt_ids: Sequence[int], tokens: Sequence[int]
               ) -> tuple[list[float], list[int]]:
        meta = _meta_info(answer)
        given, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        sent = [prompt_ids[-1], *tokens]
        if not isinstance(given, list) or [_token(e) for e in given] != sent:
            raise ScoringUnsupported("its input_token_logprobs do not cover the tokens sent")
        if not isinstance(tops, list) or len(tops) != len(sent):
            raise ScoringUnsupported("its /generate answers hold no input_top_logprobs")
        logprobs, top1 = [], []
        for offset, (entry, top) in enumerate(zip(given[1:], tops[1:], strict=True), start=len(prompt_ids)):
            best = top[0] if isinstance(top, list) and top else None
            if not (_finite(entry[0]) and isinstance(best, list) and len(best) >= 2 and isinstance(best[1], int)):
                raise ScoringUnsupported(f"its input_token_logprobs lack the log-probabilities at position {offset}")
            logprobs.append(float(entry[0]))
            top1.append(best[1])
        return logprobs, top1


def _meta_info(answer: Any) -> Mapping[str, Any]:
    meta = answer.get("meta_info") if isinstance(answer, Mapping) else None
    if not isinstance(meta, Mapping):
        raise ScoringUnsupported("its /generate answers hold no meta_info")
    reason = meta.get("finish_reason")
    if isinstance(reason, Mapping) and reason.get("type") == "abort":  # io_struct / schedule_batch FINISH_ABORT
        raise ScoringUnsupported(f"it aborted the request: {str(reason.get('message'))[:200]}")
    return meta


def _token(entry: Any) -> int | None:
    """The token id of one ``[logprob, token_id, text]`` entry."""
    return entry[1] if isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[1], int) else None


def _entry_ids(meta: Mapping[str, Any], key: str, missing: str) -> list[int]:
    entries = meta.get(key)
    ids = [_token(entry) for entry in entries] if isinstance(entries, list) else [None]
    if any(token is None for token in ids):
        raise ScoringUnsupported(f"{missing} ({key}, return_logprob)")
    return [token for token in ids if token is not None]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_FORMAT_NOTES: Mapping[str, str] = {
    "int8": "its 8-bit KV caches are fp8_e4m3, fp8_e5m2 (kvlab quant fp8_e4m3 / fp8_e5m2) and mxfp8",
    "int4": "its 4-bit KV caches are FP4 (E2M1) formats, not integer codes: nvfp4, fp4_mx_block16, fp4_e2m1",
    "int2": "it has no 2-bit KV cache",
} | ggml_formats_note("SGLang's 8-bit caches are fp8_e4m3, fp8_e5m2 and mxfp8")

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
        "--max-total-tokens": "load.kv_budget_mib",
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
    attached_note="accuracy and latency, not the KV setting: the server chose it at launch (its OpenAI completions "
                  "take no prompt_logprobs; backend kind sglang launches one server per KV setting and measures "
                  "fidelity through SGLang's native /generate)",
    scoring_api=SGLangGenerate(),
    # python/sglang/srt/sampling/sampling_params.py SamplingParams.ignore_eos, taken by its OpenAI completions
    load_fields={"ignore_eos": True},
    setting_flags={"memory_fraction": "--mem-fraction-static", "max_model_len": "--context-length",
                   "prefix_cache": "--disable-radix-cache"},
    lacks={"kv_cache_gib": "SGLang sizes its KV pool by a fraction of GPU memory, not bytes; set "
                           "server.memory_fraction (--mem-fraction-static) instead",
           "enforce_eager": "SGLang has no such option (vLLM's --enforce-eager); remove it"},
    form=FormLabels(prefix_cache="Radix cache",
                    python_help="kvlab starts `python -m ...` with it (pip install 'kvlab[sglang]' on a CUDA host)"),
)
