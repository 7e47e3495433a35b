"""The one interface every engine (embedded, OpenAI-compatible, vLLM, SGLang) implements.

:class:`Engine` declares everything the worker, the runner, telemetry and ``kvlab serve`` use,
with defaults where an engine has nothing to say; every engine inherits it, so nothing needs
``getattr`` to ask an engine what it may or may not have.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, TypeVar

from kvlab.core.errors import ConfigError, HostLacksError  # HostLacksError defined there: kvlab.tasks raises it too
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import ItemResult

if TYPE_CHECKING:
    from kvlab.core.load_spec import LoadSpec
    from kvlab.load.metrics import LevelResult

__all__ = ["Engine", "EngineFailure", "HostLacksError", "Phase", "TelemetryReading", "TelemetrySource", "passes"]

#: What an engine is doing now, stamped on every telemetry sample (the store's ``PHASES``, less
#: ``score``, which only the runner's scoring uses).
Phase = Literal["load", "prefill", "compress", "decode", "idle", "launch", "request", "bench"]


class EngineFailure(RuntimeError):
    """The engine cannot go on (a server that died, refuses the key, never became healthy).
    Runs stop with this message; the results produced before it are kept."""


class TelemetryReading(TypedDict, total=False):
    """The :class:`kvlab.store.records.TelemetrySample` columns a source read (None: unknown)."""

    rss_bytes: int | None
    cpu_percent: float | None
    kv_bytes: int | None
    gpu_memory_used_bytes: int | None
    gpu_memory_total_bytes: int | None
    gpu_utilization: float | None
    gpu_power_w: float | None
    gpu_temperature_c: float | None
    process_gpu_memory_bytes: int | None


class TelemetrySource(Protocol):
    """Something telemetry can read: returns :class:`kvlab.store.records.TelemetrySample` column values."""

    name: str

    def read(self) -> TelemetryReading: ...

    def close(self) -> None: ...


class Engine(ABC):
    """Evaluates task items under KV-cache configs.

    ``evaluate`` yields one :class:`ItemResult` per config (unscored: the runner scores).
    An engine may share work across the configs of one item -- the embedded engine runs the
    prefill once -- which is why it receives them together.  ``one_config_per_pass`` engines
    (a launched vLLM/SGLang server holds one KV dtype) get all items of one config before the
    next: see :func:`passes`.  ``evaluate_many`` runs several items at once where the engine can
    (an endpoint serving concurrent requests); by default one after the other.

    Read from other threads (the telemetry sampler): ``phase``, ``current_config`` (the label of
    the config being evaluated) and :meth:`current_kv_bytes`.
    """

    name: str
    one_config_per_pass: bool = False
    launches_servers: bool = False  # True: an idle worker stops the server it started (it holds a GPU)
    phase: Phase = "idle"
    current_config: str | None = None

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The tokenizer task prompts are sized with."""

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        """Raise :class:`kvlab.core.errors.ConfigError` for a config this engine cannot run, before any work."""
        return None

    def check_items(self, items: Sequence[TaskItem]) -> None:
        """Raise :class:`kvlab.core.errors.ConfigError` for a task this engine cannot evaluate."""
        return None

    @abstractmethod
    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]: ...

    def evaluate_many(self, work: Iterable[tuple[TaskItem, Sequence[KVCacheConfig]]]
                      ) -> Generator[tuple[TaskItem, ItemResult], None, None]:
        """Every (item, configs) of ``work``, in finishing order; here one item after the other."""
        for item, configs in work:
            for result in self.evaluate(item, configs):
                yield item, result

    def measure_load(self, config: KVCacheConfig, items: Sequence[TaskItem], load: LoadSpec, seed: int,
                     done: Collection[tuple[str, float]] = ()) -> Generator[LevelResult, None, None]:
        """``config``'s server under each of ``load``'s levels but those ``done`` (mode, level), with the prompts of
        ``items``, one :class:`~kvlab.load.metrics.LevelResult` as each level ends.  Only an engine whose server
        batches requests runs one (the backend registry's ``no_load`` says why the others do not)."""
        from kvlab.core.backends import BACKENDS

        raise ConfigError(BACKENDS[self.name].no_load if self.name in BACKENDS and BACKENDS[self.name].no_load
                          else f"the {self.name} engine runs no load phase")

    def describe(self) -> dict[str, Any]:
        """Model, device, dtype and anything else a report should record."""
        return {"engine": self.name}

    def current_kv_bytes(self) -> int | None:
        """Bytes of the KV cache in use now; None when this engine cannot know."""
        return None

    def telemetry_sources(self) -> list[TelemetrySource]:
        """Sources of its own the sampler reads besides the process's (a server's ``/metrics``)."""
        return []

    def close(self) -> None:
        """Release what the engine holds (a launched server, a client's connections)."""
        return None


T = TypeVar("T")


def passes(engine: Engine, configs: Sequence[T]) -> list[list[T]]:
    """Groups of configs to run over all items together: all at once, or one by one."""
    return [[c] for c in configs] if engine.one_config_per_pass else [list(configs)] if configs else []
