"""The ``vllm`` and ``sglang`` engines: kvlab launches the server, one KV-cache config at a time.

A server's KV dtype is fixed at launch, so each config gets its own server (``one_config_per_pass``):
launch with the exact flags (:mod:`kvlab.engines.server_flags`), wait for health, read the KV
pool (``/metrics`` first, then the start-up log) and check its bytes per token against the model's
geometry, send the items through :class:`OpenAICompatEngine`, scrape ``/metrics`` into telemetry,
and stop the server before the next config, on cancel, and on close.  Neither package is imported
here: the servers live in another Python (``server.python``, by default the venv
``scripts/install_vllm.sh`` made: :func:`kvlab.paths.engine_venv`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Generator, Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import cached_property
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from kvlab.compress.accounting import kv_bits
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.geometry import CacheGeometry
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.model_registry import KNOWN_MODELS, ModelNotAvailableError
from kvlab.core.results import ItemResult
from kvlab.engines.base import Engine, EngineFailure, TelemetryReading, TelemetrySource
from kvlab.engines.endpoint_rules import server_root
from kvlab.engines.host import default_python, probe_install, refuse_on_host
from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
from kvlab.engines.openai_compat import LaunchedKV, OpenAICompatEngine, refuse_perplexity
from kvlab.engines.prometheus import ServerMetricsSource
from kvlab.engines.server_fidelity import Reference, estimator
from kvlab.engines.server_flags import check_config, health_path, server_command, server_env
from kvlab.engines.server_logs import KVPool, startup_failure
from kvlab.engines.servers import serving_engine
from kvlab.engines.servers.installs import Install, Installed
from kvlab.models.resolve import resolve_gguf, resolve_model
from kvlab.paths import server_log_dir
from kvlab.secrets import Endpoint
from kvlab.threads import available_cores

if TYPE_CHECKING:
    from kvlab.core.load_spec import LoadSpec
    from kvlab.load.metrics import LevelResult

log = logging.getLogger(__name__)

#: How far a pool's bytes per token may stray from the model's geometry before kvlab says so (vLLM
#: rounds the pool down to whole blocks, so it holds a few bytes a token more than the layers need).
GEOMETRY_TOLERANCE = 0.01


def pool_check(geometry: CacheGeometry, pool_bytes_per_token: float | None, bits: float, layers_16bit: int = 0) -> str:
    """A pool's bytes per token against the model's geometry (``layers_16bit`` of its layers kept 16-bit), in
    words; a disagreement over :data:`GEOMETRY_TOLERANCE` says so (the bytes reported stay the server's)."""
    expected = geometry.bytes_per_token(bits, layers_16bit)
    formula = geometry.formula(bits, layers_16bit)
    if pool_bytes_per_token is None:
        return f"geometry {expected:,.0f} B/token ({formula}); the server did not state its pool's bytes"
    off = pool_bytes_per_token / expected - 1
    verdict = "agree" if abs(off) <= GEOMETRY_TOLERANCE else f"DISAGREE (over {GEOMETRY_TOLERANCE:.0%})"
    return f"pool {pool_bytes_per_token:,.0f} B/token vs geometry {expected:,.0f} ({formula}): {off:+.2%}, {verdict}"


class LaunchedServerEngine(Engine):
    one_config_per_pass = True
    launches_servers = True  # a worker stops the server once it has nothing to claim

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
        #: The baseline's reference of each item (the sampled fidelity estimator), made on the baseline's server
        #: and read by every other config's: one launch of the baseline per engine at most.
        self.references: dict[str, Reference] = {}
        self.fidelity_note: str | None = None  # why fidelity is not measured here, once known

    # -- Engine protocol -----------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.spec.model, "served_model_name": self.served_name,
                "tokenizer": self.tokenizer_note, "launches": self.launches,
                "fidelity": self.fidelity_note or estimator(serving_engine(self.name).scoring_api)}

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        for config in configs:  # every refusal happens here, before anything is launched
            check_config(self.name, config)
        # what this host's install cannot run (a missing install, fp8 on a CPU without AVX-512/AMX, a CUDA
        # build without a GPU): refused now, not by a server that dies at start-up
        refuse_on_host(self.name, self._install, list(configs))
        for config in configs:
            self._command(config, 1)
        if self.spec.load is not None and serving_engine(self.name).load_server is not None:
            self._load_program()

    def _load_program(self) -> str:
        """The engine's load server beside the install's Python (:class:`ConfigError` when it is not there)."""
        server = serving_engine(self.name)
        assert server.load_server is not None
        program = Path(self._installed.python).parent / server.load_server.program
        if not os.access(program, os.X_OK):
            raise ConfigError(f"load: {server.title}'s load phase runs on {server.load_server.program}, which is not "
                              f"in {program.parent}: {server.install_hint.format(venv=program.parent.parent)}")
        return str(program)

    @cached_property
    def _install(self) -> Install:
        """The server install: ``server.python`` (default :func:`~kvlab.engines.host.default_python`)."""
        return probe_install(self.name, self.spec.backend.server.python or default_python(self.name))

    @cached_property
    def _installed(self) -> Installed:
        """The install a launch uses, with the threads it may use on a CPU (refused if missing)."""
        refuse_on_host(self.name, self._install, [])
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()  # OpenMP also takes lists ("4,2"): then the cores
        threads = int(omp) if omp.isdigit() and int(omp) > 0 else available_cores()
        return Installed(self._install.python, cpu_build=self._install.cpu_build, threads=threads)

    @cached_property
    def _model(self) -> tuple[str, bool]:
        """What the server loads, and whether it is a local directory: a registry model's or a local
        file's converted directory (kvlab's cache, so the server needs no hub), else the id as given."""
        model = self.spec.model
        if model in KNOWN_MODELS or Path(model).expanduser().exists():
            return str(resolve_model(model)), True
        return model, False

    @cached_property
    def _served_model(self) -> str:
        """What the server is told to load: :attr:`_model`, or the model's GGUF file for an engine that loads GGUF
        (llama.cpp: a registry model's own file, no conversion)."""
        if serving_engine(self.name).model_file == "gguf":
            try:
                return str(resolve_gguf(self.spec.model))
            except ModelNotAvailableError as error:
                raise ConfigError(str(error)) from None
        return self._model[0]

    @cached_property
    def _geometry(self) -> CacheGeometry | None:
        """The model's KV geometry from its config (None for a model not on this host, or with sliding
        layers, whose pool vLLM shares out differently)."""
        model, local = self._model
        if not local:
            return None
        from transformers import AutoConfig

        from kvlab.models import model_arch

        arch = model_arch(AutoConfig.from_pretrained(model))
        return None if any(arch.layer_is_sliding) else CacheGeometry(arch.num_layers, arch.num_kv_heads, arch.head_dim)

    def _command(self, config: KVCacheConfig, port: int) -> list[str]:
        num_layers = self._geometry.num_layers if config.skip_layers is not None and self._geometry else None
        budget = self.spec.load.kv_budget_bytes if self.spec.load is not None else None
        kv_budget = None if budget is None else (budget, self._pool_bytes_per_token(config))
        return server_command(self.name, self._served_model, config, self.spec.backend.server, port, self.served_name,
                              self.spec.seed, dtype=self.spec.backend.dtype, installed=self._installed,
                              num_layers=num_layers, kv_budget=kv_budget)

    def _pool_bytes_per_token(self, config: KVCacheConfig) -> float | None:
        """The config's pool bytes per token by the model's geometry (None without one)."""
        geometry = self._geometry
        if geometry is None:
            return None
        layers_16bit = len(config.skip_layers.indices(geometry.num_layers)) if config.skip_layers else 0
        return geometry.bytes_per_token(kv_bits(config), layers_16bit)

    def check_items(self, items: Sequence[TaskItem]) -> None:
        """Perplexity refused; every item's prompt (as it is sent: context and question) and new tokens within the
        server's context (``server.max_model_len``), measured with the task's tokenizer before any launch: a server
        refuses a longer one request by request (llama.cpp: its pool's ``n_ctx`` cells).  Generated tasks were
        refused by the spec already, where their lengths are known; a file's prompts are known here."""
        refuse_perplexity(items)
        load = self.spec.load
        if load is not None and serving_engine(self.name).load_server is not None and items:
            for config in self.spec.all_configs():  # each config's pool holds one request of the load, or refused
                self._load_layout(config, items, load)
        limit = self.spec.backend.server.max_model_len
        if limit is None:
            return
        too_long = [(item, needed) for item in items
                    if (needed := len(self._tokenizer(item.context + item.question)["input_ids"])
                        + item.max_new_tokens) > limit]
        if too_long:
            item, needed = too_long[0]
            more = f" (and {len(too_long) - 1} more items)" if len(too_long) > 1 else ""
            raise ConfigError(f"item {item.item_id}: {needed:,} tokens (prompt and new tokens) exceed "
                              f"server.max_model_len = {limit:,}, the {self.name} server's context{more}; use shorter "
                              "prompts or a larger server.max_model_len")

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]:
        for config in configs:
            for _, result in self.evaluate_many([(item, [config])]):
                yield result

    def evaluate_many(self, work: Iterable[tuple[TaskItem, Sequence[KVCacheConfig]]]
                      ) -> Generator[tuple[TaskItem, ItemResult], None, None]:
        flat = ((item, config) for item, configs in work for config in configs)
        for _, group in groupby(flat, key=lambda pair: pair[1].label):
            pairs = list(group)
            if not pairs[0][1].is_baseline:
                self._references([item for item, _ in pairs])
            inner = self._launch(pairs[0][1])
            try:
                yield from inner.evaluate_many([(item, [config]) for item, config in pairs])
            except EngineFailure as error:
                raise EngineFailure(self._crash_report(error)) from None

    def measure_load(self, config: KVCacheConfig, items: Sequence[TaskItem], load: LoadSpec, seed: int,
                     done: Collection[tuple[str, float]] = ()) -> Generator[LevelResult, None, None]:
        """``config``'s server (launched for it in the load's budget, or still up from its items) under each level,
        with the engine's request fields and its ``/metrics`` read meanwhile; the telemetry's phase is "bench"."""
        from kvlab.engines.load_monitor import watch_server

        server = serving_engine(self.name)
        inner = self._launch(config) if server.load_server is None else self._launch_load(config, items, load)
        root = server_root(inner.endpoint.base_url)
        self.phase, self.current_config = "bench", config.label
        try:
            pool = self._metrics.current.pool if self._metrics.current is not None else None
            for level in inner.measure_load(config, items, load, seed, done, fields=server.load_fields,
                                            watch=watch_server(root, self.name)):
                yield replace(level, pool_tokens=pool.tokens if pool is not None else None)
                self.phase, self.current_config = "bench", config.label  # the caller stored it meanwhile
        except EngineFailure as error:
            raise EngineFailure(self._crash_report(error)) from None
        finally:
            self.phase = "request"

    @property
    def server_root(self) -> str | None:
        """The root URL of the server up now (None between configs)."""
        return server_root(self._inner.endpoint.base_url) if self._inner is not None else None

    @property
    def server_python(self) -> str:
        """The interpreter the servers run in (the engine's venv), where its own tools are importable."""
        return self._installed.python

    def telemetry_sources(self) -> list[TelemetrySource]:
        return [self._metrics]

    def close(self) -> None:
        self._stop()

    # -- one server per config -------------------------------------------------------------------

    def _references(self, items: Sequence[TaskItem]) -> None:
        """The baseline's references of ``items`` that no earlier pass made: on the baseline's server (launched
        for them; a server that cannot answer them leaves fidelity unmeasured, and says so once)."""
        if self.fidelity_note is not None or all(item.item_id in self.references or item.multi_turn
                                                 for item in items):
            return
        try:
            self.fidelity_note = self._launch(BASELINE).ensure_references(items)
        except EngineFailure as error:
            raise EngineFailure(self._crash_report(error)) from None
        if self.fidelity_note:
            log.warning("%s: %s", self.name, self.fidelity_note)

    def _launch(self, config: KVCacheConfig) -> OpenAICompatEngine:
        if self._inner is not None and self._config == config and self._server is not None and self._server.alive():
            return self._inner
        self._stop()
        options = self.spec.backend.server
        port = options.port or free_port()
        host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
        command = self._command(config, port)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        log_path = server_log_dir() / f"{self.name}-{stamp}-{port}.log"
        self.phase, self.current_config = "launch", config.label
        server = ManagedServer(command, f"http://{host}:{port}{health_path(self.name)}", log_path,
                               env=server_env(self.name, self._installed, local_model=self._model[1], config=config),
                               startup_timeout_s=options.startup_timeout_s)
        try:
            server.start()
            server.wait_healthy()
        except (ServerStartError, OSError) as error:
            server.stop()
            cause = startup_failure(server.log_text(), str(error).splitlines()[0],
                                    serving_engine(self.name).startup_faults)
            raise EngineFailure(f"{self.name} did not start for {config.label}: {cause} (log: {log_path})") from None
        root = f"http://{host}:{port}"
        pool, where = read_pool(self.name, root, server.log_text())
        bits = kv_bits(config)
        per_token = pool.bytes_per_token if pool else None
        geometry = self._geometry
        layers_16bit = len(config.skip_layers.indices(geometry.num_layers)) if config.skip_layers and geometry else 0
        check = pool_check(geometry, per_token, bits, layers_16bit) if geometry else "no geometry to check it against"
        if "DISAGREE" in check:
            log.warning("%s pool for %s: %s", self.name, config.label, check)
        # the same pool at 16 bits: the server's own bytes scaled by the geometry's ratio (its rounding kept)
        scale = (geometry.bytes_per_token() / geometry.bytes_per_token(bits, layers_16bit)) if geometry else 16 / bits
        baseline = per_token * scale if per_token else None
        chosen = f"; the engine chose {pool.chosen_text}" if pool and pool.chosen else ""
        launched = LaunchedKV(config=config, bytes_per_token=per_token, baseline_bytes_per_token=baseline,
                              source=(f"{self.name} {where}: {pool.source_line}" if pool else
                                      f"{self.name}: no KV pool on /metrics or in the start-up log") + f"; {check}"
                                     + chosen)
        endpoint = Endpoint(base_url=f"{root}/v1", model_id=self.served_name, api_key=None,
                            key_source="none (a server kvlab launched on this host)")
        self._server, self._config = server, config
        backend = self.spec.backend
        if serving_engine(self.name).one_request_at_a_time and backend.max_concurrency > 1:
            backend = backend.model_copy(update={"max_concurrency": 1})
        self._inner = OpenAICompatEngine(endpoint, backend, self._tokenizer, self.tokenizer_note,
                                         launched=launched, seed=self.spec.seed, references=self.references,
                                         plain_sampling=serving_engine(self.name).plain_sampling,
                                         scoring_api=serving_engine(self.name).scoring_api)
        self._metrics.current = ServerMetricsSource(root, self.name, pool)
        self.launches.append({"config": config.label, "command": command, "log": str(log_path),
                              "kv_pool": launched.source, "geometry_check": check,
                              "engine_chose": dict(pool.chosen) if pool else {},
                              "requests_in_flight": backend.max_concurrency})
        self.phase = "request"
        return self._inner

    def _launch_load(self, config: KVCacheConfig, items: Sequence[TaskItem], load: LoadSpec) -> OpenAICompatEngine:
        """The engine's load server (:attr:`~kvlab.engines.servers.base.ServingEngine.load_server`) for ``config``: a
        pool of the cells the budget holds at the config's bytes per token, shared by as many slots as sequences of
        the workload's longest request (prompt and output tokens) fit in it."""
        server = serving_engine(self.name)
        assert server.load_server is not None
        cells, longest, slots = self._load_layout(config, items, load)
        self._stop()
        port = free_port()
        program = self._load_program()
        kv_dtypes = (server.kv_dtypes[config.quant], server.kv_dtypes[config.value_format])
        command = [program, "--host", "127.0.0.1", "--port", str(port),
                   *server.load_args(self._served_model, kv_dtypes, self._installed, self.served_name,
                                     self.spec.seed, cells, slots)]
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        log_path = server_log_dir() / f"{self.name}-load-{stamp}-{port}.log"
        self.phase, self.current_config = "launch", config.label
        managed = ManagedServer(command, f"http://127.0.0.1:{port}{server.load_server.health_path}", log_path,
                                env=server_env(self.name, self._installed, local_model=self._model[1],
                                               config=config),
                                startup_timeout_s=self.spec.backend.server.startup_timeout_s)
        try:
            managed.start()
            managed.wait_healthy()
        except (ServerStartError, OSError) as error:
            managed.stop()
            cause = startup_failure(managed.log_text(), str(error).splitlines()[0], server.startup_faults)
            raise EngineFailure(f"{server.load_server.program} did not start for {config.label}: {cause} "
                                f"(log: {log_path})") from None
        root = f"http://127.0.0.1:{port}"
        pool = server.parse_pool(managed.log_text())
        endpoint = Endpoint(base_url=f"{root}/v1", model_id=self.served_name, api_key=None,
                            key_source="none (a server kvlab launched on this host)")
        self._server, self._config = managed, None  # not the items' server: the next item launches theirs
        self._inner = OpenAICompatEngine(endpoint, self.spec.backend, self._tokenizer, self.tokenizer_note,
                                         seed=self.spec.seed, references=self.references)
        self._metrics.current = ServerMetricsSource(root, self.name, pool)
        self.launches.append({"config": config.label, "command": command, "log": str(log_path), "load": True,
                              "kv_pool": f"{server.load_server.program} start-up log: {pool.source_line}" if pool
                              else f"{server.load_server.program}: no KV pool in its start-up log",
                              "engine_chose": dict(pool.chosen) if pool else {},
                              "slots": slots, "longest_request_tokens": longest})
        return self._inner

    def _load_layout(self, config: KVCacheConfig, items: Sequence[TaskItem], load: LoadSpec) -> tuple[int, int, int]:
        """The load server's pool cells for ``config`` in the load's budget, the workload's longest request (prompt
        and output tokens) and the slots of that length the cells hold (:class:`ConfigError` for none)."""
        server = serving_engine(self.name)
        assert load.kv_budget_bytes is not None  # the spec's check_load
        per_token = self._pool_bytes_per_token(config)
        if per_token is None:
            raise ConfigError(f"load: a load phase on {server.title} needs the model's geometry to size its pool")
        cells = server.with_budget(self.spec.backend.server, load.kv_budget_bytes, per_token)[0].max_model_len or 0
        longest = max(len(self._tokenizer(item.context + item.question)["input_ids"]) for item in items) \
            + load.output_tokens
        if cells // longest < 1:
            raise ConfigError(f"load.kv_budget_mib holds {cells:,} tokens of {server.title}'s pool for config "
                              f"'{config.label}', fewer than the workload's longest request ({longest:,} tokens with "
                              "its output): give a larger budget")
        return cells, longest, cells // longest

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


def read_pool(kind: str, root: str, log_text: str) -> tuple[KVPool | None, str]:
    """The pool as ``/metrics`` states it (where the engine states it there: vLLM's ``cache_config_info``), else
    as the start-up log does, and which of the two said it; a ``/metrics`` pool without bytes (vLLM sized it
    itself) takes the log's when the log has them."""
    server = serving_engine(kind)
    stated = None
    if server.pool_on_metrics:
        try:
            stated = server.stated_pool(httpx.get(f"{root}/metrics", timeout=10, trust_env=False).text)
        except httpx.HTTPError as error:
            log.info("no /metrics from %s (%s): reading the start-up log", root, error)
    logged = server.parse_pool(log_text)
    if stated is not None and (stated.bytes is not None or logged is None or logged.bytes is None):
        return stated, "/metrics"
    return logged, "start-up log"


class _CurrentServerMetrics:
    """Telemetry from whichever server is up now (servers come and go between configs)."""

    name = "server"

    def __init__(self) -> None:
        self.current: ServerMetricsSource | None = None

    def read(self) -> TelemetryReading:
        source = self.current
        return source.read() if source is not None else {}

    def close(self) -> None:
        if self.current is not None:
            self.current.close()


def build(spec: ExperimentSpec) -> LaunchedServerEngine:
    """A server kvlab launches per KV dtype (the backend registry's ``vllm`` and ``sglang`` entries)."""
    from kvlab.engines.factory import task_tokenizer

    return LaunchedServerEngine(spec, *task_tokenizer(spec.model))
