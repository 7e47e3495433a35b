"""The one interface every engine (embedded, OpenAI-compatible, vLLM, SGLang) implements."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from kvlab.config import KVCacheConfig
from kvlab.errors import HostLacksError  # defined there: kvlab.tasks raises it too
from kvlab.results import ItemResult
from kvlab.tasks import TaskItem


class EngineFailure(RuntimeError):
    """The engine cannot go on (a server that died, refuses the key, never became healthy).
    Runs stop with this message; the results produced before it are kept."""


class Engine(Protocol):
    """Evaluates task items under KV-cache configs.

    ``evaluate`` yields one :class:`ItemResult` per config (unscored: the runner scores).
    An engine may share work across the configs of one item -- the embedded engine runs the
    prefill once -- which is why it receives them together.  ``one_config_per_pass`` engines
    (a launched vLLM/SGLang server holds one KV dtype) get all items of one config before the
    next: see :func:`passes`.  An engine may also define ``evaluate_many(work)`` to run several
    items at once (an endpoint serving concurrent requests): see :func:`evaluate_all`.
    """

    name: str
    one_config_per_pass: bool

    @property
    def tokenizer(self) -> Any: ...

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        """Raise :class:`kvlab.config.ConfigError` for a config this engine cannot run, before any work."""

    def check_items(self, items: Sequence[TaskItem]) -> None:
        """Raise :class:`kvlab.config.ConfigError` for a task this engine cannot evaluate."""

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]: ...

    def describe(self) -> dict[str, Any]:
        """Model, device, dtype and anything else a report should record."""

    def close(self) -> None: ...


T = TypeVar("T")


def passes(engine: Engine, configs: Sequence[T]) -> list[list[T]]:
    """Groups of configs to run over all items together: all at once, or one by one."""
    return [[c] for c in configs] if engine.one_config_per_pass else [list(configs)] if configs else []


def evaluate_all(engine: Engine, work: Iterable[tuple[TaskItem, Sequence[KVCacheConfig]]]
                 ) -> Iterator[tuple[TaskItem, ItemResult]]:
    """Every (item, configs) of ``work``, concurrently where the engine can, in finishing order."""
    many = getattr(engine, "evaluate_many", None)
    if many is not None:
        yield from many(work)
        return
    for item, configs in work:
        for result in engine.evaluate(item, configs):
            yield item, result
