"""llama.cpp: everything kvlab knows of it, from its sources (llama.cpp as ``llama-cpp-python`` 0.3.36 vendors it,
and that package's own server; each rule cites the file) and from its build measured here
(``scripts/install_llamacpp.sh``).

kvlab launches llama-cpp-python's OpenAI-compatible server (``llama_cpp.server``) for a config's items rather than
the C++ ``llama-server``: both run the same llama.cpp, but the C++ server gives no prompt log-probabilities (it
refuses ``echo``), which the sampled fidelity estimator needs, and the Python one gives them off by one position
(:mod:`.llamacpp_server` says how; it adds vLLM's ``prompt_logprobs`` and ``return_token_ids`` computed from
llama.cpp's own logits).  The Python server answers one request at a time, so a ``[load]`` phase runs on the C++
``llama-server`` (built from the same vendored sources by ``scripts/install_llamacpp.sh``), which batches its
``--parallel`` slots; a running ``llama-server`` is also reachable by URL (backend kind ``openai_compat``).

A load budget on llama.cpp: ``-c`` cells = the budget / the config's bytes per token, in one pool that every slot
shares (``--kv-unified``), and as many slots as sequences of the workload's longest request fit in the cells.
llama-server admits no more: it neither preempts nor queues inside its pool (tools/server/server-context.cpp: a
decode that finds no free cell fails every running slot, "Context size has been exceeded."), so a request that
finds no free slot waits (``llamacpp:requests_deferred``) and a compressed cache holds more slots at once.

llama.cpp stores keys and values in separate types (``type_k`` / ``type_v``; ``--cache-type-k`` /
``--cache-type-v`` on ``llama-server``), in its own block formats (kvlab's formats of kind ``ggml``), in a pool of
``n_ctx`` cells that it sizes at start-up and logs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.core.errors import ConfigError
from kvlab.core.units import MIB
from kvlab.engines.server_logs import KVPool, StartupFault, last_match, line_of
from kvlab.engines.servers.base import FormLabels, LoadServer, MetricNames, ServingEngine

if TYPE_CHECKING:
    from kvlab.core.experiment_spec import ServerOptions
    from kvlab.engines.servers.installs import HostCPU, Install, Installed

# ggml/include/ggml.h enum ggml_type: llama-cpp-python's type_k / type_v take these numbers.
GGML_TYPES: Mapping[str, int] = {"f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20,
                                 "bf16": 30}
# src/llama-kv-cache.cpp llama_kv_cache::llama_kv_cache: LLAMA_LOG_INFO("%s: size = %7.2f MiB (%6u cells, %3d layers,
# %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB\n", __func__, ...) -- logged once the pool is allocated
# (llama-cpp-python prints llama.cpp's log on stderr with verbose = true).
# src/llama-kv-cache.cpp: LLAMA_LOG_INFO("%s: attn_rot_k = %d, n_embd_head_k_all = %d\n", __func__, ...) and
# attn_rot_v: whether llama.cpp rotates quantized keys / values with a Hadamard transform (it does when their type is
# quantized and the head dimension allows; LLAMA_ATTN_ROT_DISABLE=1 turns it off), logged after the pool's line.
_ROTATION = re.compile(r"llama_kv_cache: (attn_rot_[kv]) = (\d+)")
_POOL = re.compile(r"llama_kv_cache: size = +(\d+(?:\.\d+)?) MiB \( *(\d+) cells, +(\d+) layers, +\d+/\d+ seqs\), "
                   r"K \((\w+)\): +(\d+(?:\.\d+)?) MiB, V \((\w+)\): +(\d+(?:\.\d+)?) MiB")


@dataclass(frozen=True)
class LlamaCppEngine(ServingEngine):
    def launch_args(self, model: str, kv_dtypes: tuple[str, str], options: ServerOptions, installed: Installed,
                    dtype: str, served_model_name: str, seed: int) -> list[str]:
        # llama_cpp/server/settings.py ModelSettings (flags derived from field names by llama_cpp/server/cli.py
        # add_args_from_model: "--{name}", booleans as "true"/"false"): model, model_alias, n_ctx (0 = the model's
        # trained context), n_threads / n_threads_batch (default: half the cores), type_k / type_v (ggml_type
        # numbers), flash_attn, logits_all (every position's logits: what echo + logprobs reads), seed, verbose
        # (llama.cpp's own log on stderr, which states the pool).
        key, value = kv_dtypes
        return ["--model", model, "--model_alias", served_model_name,
                "--type_k", str(GGML_TYPES[key]), "--type_v", str(GGML_TYPES[value]),
                # llama.cpp stores a quantized V only with flash attention (src/llama-context.cpp: "V cache
                # quantization requires flash_attn"); every config runs it, the baseline too, so that two configs
                # differ in their cache types alone
                "--flash_attn", "true", "--logits_all", "true",
                "--n_ctx", str(options.max_model_len or 0),
                "--n_threads", str(installed.threads), "--n_threads_batch", str(installed.threads),
                "--seed", str(seed), "--verbose", "true",
                # llama_cpp/server/settings.py ServerSettings.interrupt_requests (default true): a streamed answer
                # stops at the next token once another request waits, so queued requests would cut each other short
                "--interrupt_requests", "false"]

    def with_budget(self, options: ServerOptions, budget_bytes: int, bytes_per_token: float | None
                    ) -> tuple[ServerOptions, list[str]]:
        """The pool's cells (``n_ctx``) that the budget holds at this config's bytes per token."""
        if options.max_model_len is not None:
            raise ConfigError("server.max_model_len is llama.cpp's pool (n_ctx), which load.kv_budget_mib sizes for "
                              "every config: remove server.max_model_len")
        if bytes_per_token is None:
            raise ConfigError("load.kv_budget_mib on llama.cpp needs the model's geometry (its config.json or GGUF "
                              "header), to turn the bytes into the pool's cells")
        return options.model_copy(update={"max_model_len": budget_cells(budget_bytes, bytes_per_token)}), []

    def load_args(self, model: str, kv_dtypes: tuple[str, str], installed: Installed, served_model_name: str,
                  seed: int, cells: int, slots: int) -> list[str]:
        # common/arg.cpp (llama-server): -c cells, -np slots, -kvu one pool for every slot, --metrics (Prometheus),
        # -fit off (no context adjusted to the device's memory), -cram 0 (no prompt cache in host memory beside the
        # pool), -fa on as the item server runs it (a quantized V needs it), -lv 4: libllama's own INFO lines, which
        # common/log.cpp files at verbosity 4 (the pool's "llama_kv_cache: size = ..." line among them)
        key, value = kv_dtypes
        return ["-m", model, "-a", served_model_name, "-c", str(cells), "-np", str(slots), "-kvu", "--metrics",
                "-ctk", key, "-ctv", value, "-fa", "on", "-fit", "off", "-cram", "0", "--no-webui", "-lv", "4",
                "-t", str(installed.threads), "-tb", str(installed.threads), "-s", str(seed)]

    def parse_pool(self, log_text: str) -> KVPool | None:
        match = last_match(_POOL, log_text)
        if match is None:
            return None
        key_mib, value_mib = float(match.group(5)), float(match.group(7))
        # the rotation lines follow the pool's line of the same start
        rotation = {name: value for name, value in _ROTATION.findall(log_text, match.end())}
        return KVPool(int(match.group(2)), round((key_mib + value_mib) * MIB) or None, line_of(log_text, match),
                      f"K {match.group(4)}, V {match.group(6)}", chosen=rotation)

    def entry(self) -> list[str]:
        """llama-cpp-python's server with vLLM's ``prompt_logprobs`` and ``return_token_ids`` (:mod:`.llamacpp_server`,
        run as a script by the llama.cpp venv's Python; ``-P``: this directory's modules stay off its path)."""
        return ["-P", str(Path(__file__).with_name("llamacpp_server.py"))]

    def why_not_here(self, install: Install, quant: str, cpu: HostCPU, gpus: tuple[str, ...]) -> str | None:
        """None: install_llamacpp.sh builds llama.cpp for this host's own CPU (and CUDA where a GPU is), and every
        cache type runs on every CPU llama.cpp builds for."""
        return None

    def deploy_flag(self, key_dtype: str, value_dtype: str) -> str:
        # tools/server (llama-server) and the llama.cpp CLI: --cache-type-k / --cache-type-v, -fa on|off|auto
        return f"--cache-type-k {key_dtype} --cache-type-v {value_dtype} -fa on"


#: src/llama-context.cpp: ``cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)``: llama.cpp rounds the pool's cells up
N_CTX_PAD = 256


def budget_cells(budget_bytes: int, bytes_per_token: float) -> int:
    """The pool's cells that ``budget_bytes`` hold at ``bytes_per_token``: whole multiples of :data:`N_CTX_PAD`, which
    llama.cpp would otherwise round up past the budget (the capacity projection rounds so too:
    ``pool_granule_tokens``)."""
    return int(budget_bytes // bytes_per_token) // N_CTX_PAD * N_CTX_PAD


_FORMAT_NOTES: Mapping[str, str] = {
    "int8": "its 8-bit cache type is q8_0 (32 values per float16 scale, symmetric): kvlab quant q8_0",
    "int4": "its 4-bit cache types are q4_0, q4_1 and iq4_nl (blocks of 32 values): kvlab quant q4_0 / q4_1 / iq4_nl",
    "int2": "it has no 2-bit KV cache type (its lowest are the 4-bit q4_0, q4_1 and iq4_nl)",
    "fp8_e4m3": "it has no fp8 KV cache type (its 8-bit type is q8_0)",
    "fp8_e5m2": "it has no fp8 KV cache type (its 8-bit type is q8_0)",
}

LLAMACPP = LlamaCppEngine(
    kind="llamacpp",
    # llama_cpp/server/__main__.py: main() parses ServerSettings and ModelSettings from argv, builds the app (which
    # loads the model) and only then runs uvicorn
    module="llama_cpp.server",
    package="llama_cpp",
    distributions=("llama-cpp-python",),
    # llama_cpp/server/app.py has no /health; /v1/models answers once uvicorn serves, after the model loaded
    health_path="/v1/models",
    install_hint="run scripts/install_llamacpp.sh (it builds llama.cpp for this host; kvlab then finds it in {venv})",
    no_eviction="llama.cpp does not evict tokens from a sequence's KV cache (its context shift drops the oldest half "
                "only once the context is full); its cache knobs are the K and V types (kvlab quant / value_quant) "
                "and the pool's cells (server.max_model_len)",
    plain_fp8="it has no fp8 cache type",
    format_notes=_FORMAT_NOTES,
    own_flags={
        "--host": "server.host", "--port": "server.port", "--model": "the spec's model (its GGUF file)",
        "--model_alias": "the served model name", "--type_k": "the config's quant",
        "--type_v": "the config's value_quant", "--flash_attn": "kvlab (on for every config)",
        "--logits_all": "kvlab (on: the fidelity estimator reads the prompt's log-probabilities)",
        "--n_ctx": "server.max_model_len", "--n_threads": "kvlab (this worker's cores)",
        "--n_threads_batch": "kvlab (this worker's cores)", "--seed": "the spec's seed",
        "--verbose": "kvlab (on: its log states the KV pool)",
        "--interrupt_requests": "kvlab (off: an answer is never cut short by the next request)",
    },
    # llama_cpp/server/settings.py ServerSettings.api_key: a flag (or the API_KEY environment variable that
    # pydantic-settings reads)
    key_flags={"--api_key": "llama-cpp-python's server reads the key from the API_KEY environment variable instead"},
    # tools/server/server-task.cpp (llama-server --metrics): gauges llamacpp:requests_processing and
    # llamacpp:requests_deferred; no pool usage and no preemptions (it has none).  llama-cpp-python's server has no
    # /metrics.
    metrics=MetricNames(running=("llamacpp:requests_processing",), waiting=("llamacpp:requests_deferred",)),
    setting_flags={"max_model_len": "--n_ctx (the pool's cells)"},
    lacks={**{name: "llama.cpp sizes its KV pool in tokens, not by memory; its pool holds server.max_model_len tokens "
                    "(n_ctx): remove it" for name in ("memory_fraction", "kv_cache_gib")},
           "enforce_eager": "llama.cpp has no such option; remove it",
           "prefix_cache": "llama-cpp-python's server always reuses the longest common prefix of the previous "
                           "request; remove it"},
    form=FormLabels(prefix_cache="Prefix reuse (always on)",
                    python_help="kvlab starts `python -m llama_cpp.server` with it. Blank: the venv "
                                "scripts/install_llamacpp.sh made, else `python`"),
    startup_faults=(
        # llama_cpp/llama.py Llama.__init__: raise ValueError(f"Model path does not exist: {model_path}")
        StartupFault(re.compile(r"Model path does not exist: .*"), "its GGUF file is not there",
                     "give the spec's model as a kvlab registry model or a local .gguf file"),
        # src/llama-model-loader.cpp / gguf.cpp on a file that is not GGUF: "failed to load model"
        StartupFault(re.compile(r"gguf_init_from_file\w*: .*|failed to load model.*|Failed to load model.*"),
                     "llama.cpp cannot load the model file", "give a GGUF file llama.cpp reads (kvlab passes a "
                     "registry model's own GGUF)"),
    ),
    model_file="gguf",
    # llama_cpp/server/app.py get_llama_proxy: one request holds the model at a time (its two locks)
    one_request_at_a_time=True,
    # tools/server/server-context.cpp (llama-server): {"owned_by", "llamacpp"}; llama_cpp/server/app.py
    # (llama-cpp-python): "owned_by": "me"
    owned_by=("llamacpp", "me"),
    attached_note="accuracy, latency and tokens; not fidelity: llama-server gives no prompt log-probabilities and "
                  "llama-cpp-python's echo scores each prompt token off by one position, so kvlab measures llama.cpp's "
                  "fidelity on the server it launches (backend kind 'llamacpp')",
    # llama_cpp/server/types.py CreateCompletionRequest: top_k 40, min_p 0.05, repeat_penalty 1.0 by default
    # (top_k 0 disables it in llama.cpp's sampler: src/llama-sampler.cpp llama_sampler_top_k_impl)
    plain_sampling={"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0},
    # tools/server/server-context.cpp: /health answers 200 once the model is loaded (503 while loading);
    # scripts/install_llamacpp.sh puts llama-server beside the venv's Python
    load_server=LoadServer(program="llama-server", health_path="/health"),
    # src/llama-kv-cache.cpp: getenv("LLAMA_ATTN_ROT_DISABLE") turns attn_rot_k and attn_rot_v off
    rotation_off_env={"LLAMA_ATTN_ROT_DISABLE": "1"},
    pool_granule_tokens=N_CTX_PAD,
    # tools/server/server-task.cpp params_from_json_cmpl: ignore_eos
    load_fields={"ignore_eos": True},
)
