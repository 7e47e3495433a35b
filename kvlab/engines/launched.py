"""The ``vllm`` and ``sglang`` engines: kvlab launches the server, one KV-cache config at a time.

A server's KV dtype is fixed at launch, so each config gets its own server (``one_config_per_pass``):
launch with the exact flags (:mod:`kvlab.engines.server_flags`), wait for health, read the KV
pool from the start-up log, send the items through :class:`OpenAICompatEngine`, scrape
``/metrics`` into telemetry, and stop the server before the next config, on cancel, and on close.
Neither package is imported here: the servers may live in another Python (``server.python``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.formats import FORMATS
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import ItemResult
from kvlab.engines.base import Engine, EngineFailure, HostLacksError, TelemetrySource
from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
from kvlab.engines.openai_compat import LaunchedKV, OpenAICompatEngine, refuse_perplexity
from kvlab.engines.prometheus import ServerMetricsSource
from kvlab.engines.server_flags import check_config, health_path, server_command
from kvlab.engines.server_logs import parse_kv_pool
from kvlab.paths import server_log_dir
from kvlab.secrets import Endpoint
from kvlab.tasks import TaskItem

#: Bits per stored element of each ``--kv-cache-dtype`` kvlab passes ("auto" is the model's 16-bit dtype).
KV_DTYPE_BITS = {name: f.bits for name, f in FORMATS.items() if f.vllm or f.sglang}  # what servers run


class LaunchedServerEngine(Engine):
    one_config_per_pass = True
    launches_servers = True  # workers stop the server when a batch ends

    def __init__(self, spec: ExperimentSpec, tokenizer: Any, tokenizer_note: str):
        self.name = spec.backend.kind
        self.spec = spec
        self._tokenizer = tokenizer
        self.tokenizer_note = tokenizer_note
        self.served_name = spec.backend.model_id or spec.model
        self.launches: list[dict[str, Any]] = []
        self._server: ManagedServer | None = None
        self._config: KVCacheConfig | None = None
        self._inner: OpenAICompatEngine | None = None
        self._metrics = _CurrentServerMetrics()

    # -- Engine protocol -----------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.spec.model, "served_model_name": self.served_name,
                "tokenizer": self.tokenizer_note, "launches": self.launches}

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        for config in configs:  # every refusal happens here, before anything is launched
            check_config(self.name, config)
            server_command(self.name, self.spec.model, config, self.spec.backend.server, 1, self.served_name)
        self._check_installed()

    def _check_installed(self) -> None:
        """The server's package must be importable by ``server.python`` (looked up, not imported)."""
        python = self.spec.backend.server.python
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({self.name!r}) is None)"
        try:
            found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired) as error:
            raise HostLacksError(f"backend.server.python = {python!r} cannot be run: {error}") from None
        if not found:
            raise HostLacksError(
                f"{self.name} is not installed for {python!r}: on a CUDA host run `pip install 'kvlab[{self.name}]'`, "
                f"or set backend.server.python to an interpreter that has {self.name}")

    def check_items(self, items: Sequence[TaskItem]) -> None:
        refuse_perplexity(items)

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]:
        for config in configs:
            for _, result in self.evaluate_many([(item, [config])]):
                yield result

    def evaluate_many(self, work: Iterable[tuple[TaskItem, Sequence[KVCacheConfig]]]
                      ) -> Iterator[tuple[TaskItem, ItemResult]]:
        flat = ((item, config) for item, configs in work for config in configs)
        for _, group in groupby(flat, key=lambda pair: pair[1].label):
            pairs = list(group)
            inner = self._launch(pairs[0][1])
            try:
                yield from inner.evaluate_many([(item, [config]) for item, config in pairs])
            except EngineFailure as error:
                raise EngineFailure(self._crash_report(error)) from None

    def telemetry_sources(self) -> list[TelemetrySource]:
        return [self._metrics]

    def close(self) -> None:
        self._stop()

    # -- one server per config -------------------------------------------------------------------

    def _launch(self, config: KVCacheConfig) -> OpenAICompatEngine:
        if self._inner is not None and self._config == config and self._server is not None and self._server.alive():
            return self._inner
        self._stop()
        options = self.spec.backend.server
        port = options.port or free_port()
        host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
        command = server_command(self.name, self.spec.model, config, options, port, self.served_name, self.spec.seed)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        log_path = server_log_dir() / f"{self.name}-{stamp}-{port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.phase, self.current_config = "launch", config.label
        server = ManagedServer(command, f"http://{host}:{port}{health_path(self.name)}", log_path,
                               startup_timeout_s=options.startup_timeout_s)
        try:
            server.start()
            server.wait_healthy()
        except (ServerStartError, OSError) as error:
            server.stop()
            raise EngineFailure(f"{self.name} did not start for {config.label} (log: {log_path}): {error}") from None
        pool = parse_kv_pool(self.name, server.log_text())
        bits = KV_DTYPE_BITS[config.quant]
        per_token = pool.bytes_per_token if pool else None
        launched = LaunchedKV(config=config, bytes_per_token=per_token,
                              baseline_bytes_per_token=per_token * 16 / bits if per_token else None,
                              source=f"{self.name} start-up log: {pool.source_line}" if pool else
                              f"{self.name} start-up log: no KV pool line found")
        endpoint = Endpoint(base_url=f"http://{host}:{port}/v1", model_id=self.served_name, api_key=None,
                            key_source="none (a server kvlab launched on this host)")
        self._server, self._config = server, config
        self._inner = OpenAICompatEngine(endpoint, self.spec.backend, self._tokenizer, self.tokenizer_note,
                                         launched=launched, seed=self.spec.seed)
        self._metrics.current = ServerMetricsSource(f"http://{host}:{port}", self.name, pool)
        self.launches.append({"config": config.label, "command": command, "log": str(log_path),
                              "kv_pool": launched.source})
        self.phase = "request"
        return self._inner

    def _crash_report(self, error: EngineFailure) -> str:
        server = self._server
        if server is None or server.alive():
            return str(error)
        return f"the {self.name} server exited during the trial ({error}); its last log lines:\n{server.log_tail()}"

    def _stop(self) -> None:
        self._metrics.current = None
        if self._inner is not None:
            self._inner.close()
        if self._server is not None:
            self._server.stop()
        self._server = self._config = self._inner = None
        self.phase, self.current_config = "idle", None


class _CurrentServerMetrics:
    """Telemetry from whichever server is up now (servers come and go between configs)."""

    name = "server"

    def __init__(self) -> None:
        self.current: ServerMetricsSource | None = None

    def read(self) -> dict[str, float | None]:
        source = self.current
        return source.read() if source is not None else {}

    def close(self) -> None:
        if self.current is not None:
            self.current.close()


def build(spec: ExperimentSpec) -> LaunchedServerEngine:
    """A server kvlab launches per KV dtype (the backend registry's ``vllm`` and ``sglang`` entries)."""
    from kvlab.engines.factory import task_tokenizer

    return LaunchedServerEngine(spec, *task_tokenizer(spec.model))
