"""The one interface every engine (embedded, OpenAI-compatible, vLLM, SGLang) implements."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from kvlab.config import KVCacheConfig
from kvlab.results import ItemResult
from kvlab.tasks import TaskItem


class Engine(Protocol):
    """Evaluates task items under KV-cache configs.

    ``evaluate`` yields one :class:`ItemResult` per config (unscored: the runner scores).
    An engine may share work across the configs of one item -- the embedded engine runs the
    prefill once -- which is why it receives them together.
    """

    name: str

    @property
    def tokenizer(self) -> Any: ...

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        """Raise :class:`kvlab.config.ConfigError` for a config this engine cannot run, before any work."""

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]: ...

    def describe(self) -> dict[str, Any]:
        """Model, device, dtype and anything else a report should record."""

    def close(self) -> None: ...
