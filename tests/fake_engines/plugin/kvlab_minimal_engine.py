"""The smallest serving engine a package can add to kvlab: this module and one line of its package's entry points
(``[kvlab.backends] minimal = "kvlab_minimal_engine:BACKEND"``), nothing in kvlab itself.

Its "server" is ``kvlab serve`` (kvlab's own OpenAI-compatible server, the embedded engine underneath), launched
as any engine is: kvlab starts ``python -m kvlab.cli serve`` per KV setting, waits on its health path, sends the items
and scores the baseline's samples through its OpenAI completions (``return_token_ids``, ``prompt_logprobs``).
It states no pool in its log, so the bytes are the ones kvlab estimates for the setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.backends import Backend
from kvlab.core.experiment_spec import ServerOptions
from kvlab.engines.server_logs import KVPool
from kvlab.engines.servers.base import FormLabels, MetricNames, ServingEngine
from kvlab.engines.servers.installs import HostCPU, Install, Installed

BACKEND = Backend("minimal", "Minimal engine", "kvlab.engines.launched",
                  "kvlab serve launched as a serving engine (a plugin's example)", kv_choice="server_dtypes",
                  launches_server=True, fields=("model_id", "server"), kv_dtypes={"none": "none", "int8": "int8"},
                  server="kvlab_minimal_engine:ENGINE")


@dataclass(frozen=True)
class MinimalEngine(ServingEngine):
    def entry(self) -> list[str]:
        return ["-m", "kvlab.cli", "serve"]

    def launch_args(self, model: str, kv_dtypes: tuple[str, str], options: ServerOptions, installed: Installed,
                    dtype: str, served_model_name: str, seed: int) -> list[str]:
        return ["--model", model, "--served-model-name", served_model_name, "--quant", kv_dtypes[0],
                "--threads", "1"]

    def parse_pool(self, log_text: str) -> KVPool | None:
        return None

    def why_not_here(self, install: Install, quant: str, cpu: HostCPU, gpus: tuple[str, ...]) -> str | None:
        return None  # runs wherever kvlab does


ENGINE = MinimalEngine(
    kind="minimal", module="kvlab.cli", health_path="/health", install_hint="pip install kvlab",
    no_eviction="the minimal engine evicts no tokens", plain_fp8="it stores no fp8 cache",
    format_notes={}, own_flags={"--model": "the spec's model", "--quant": "the config's quant"}, key_flags={},
    metrics=MetricNames(), package="kvlab", distributions=("kvlab",),
    form=FormLabels(prefix_cache="Prefix cache",
                    python_help="an interpreter with kvlab installed"))
