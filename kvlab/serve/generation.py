"""One served request: prompt tokens in, text deltas out, with OpenAI's stop-string semantics.

The embedded engine runs one request at a time (a lock); others wait, visible in
``kvlab:num_requests_waiting``.  Text is streamed as soon as it cannot turn into a stop string
any more, and the stop string itself is never sent -- what OpenAI and vLLM do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvlab.compress.accounting import compression_ratio
from kvlab.config import KVCacheConfig
from kvlab.engines.embedded import EmbeddedEngine, ServedPrefix
from kvlab.serve.metrics import ServerMetrics


@dataclass
class Delta:
    text: str


@dataclass
class Finished:
    finish_reason: str  # "stop" (end token or stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    kv_cache: dict[str, Any] = field(default_factory=dict)


class ServedModel:
    """The embedded engine, its served name and default KV config, and the server's metrics."""

    def __init__(self, engine: EmbeddedEngine, name: str, default_config: KVCacheConfig):
        self.engine = engine
        self.name = name
        self.default_config = default_config
        self.max_model_len = int(getattr(engine.model.config, "max_position_embeddings", 0) or 0)
        self.metrics = ServerMetrics(name, engine.current_kv_bytes)
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def encode(self, prompt: str, question_chars: int | None = None, special: bool = True
               ) -> tuple[list[int], list[int]]:
        """``(context, question)`` token ids.  The question is the last ``question_chars``
        characters, tokenized on its own as the embedded backend does; without it, the last token."""
        if question_chars:
            context, question = prompt[:-question_chars], prompt[-question_chars:]
            return (self.tokenizer(context, add_special_tokens=special)["input_ids"],
                    self.tokenizer(question, add_special_tokens=False)["input_ids"])
        ids = self.tokenizer(prompt, add_special_tokens=special)["input_ids"]
        return ids[:-1], ids[-1:]

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def _text(self, ids: list[int], stop: Sequence[str]) -> tuple[str, bool]:
        """The text of ``ids`` up to the first stop string, and whether one was found."""
        text = self.tokenizer.decode([t for t in ids if t not in self.engine.stop_ids], skip_special_tokens=True)
        cut = min((i for s in stop if (i := text.find(s)) >= 0), default=-1)
        return (text[:cut], True) if cut >= 0 else (text, False)

    def generate(self, prompt: tuple[list[int], list[int]], config: KVCacheConfig, max_tokens: int,
                 stop: Sequence[str]) -> Iterator[Delta | Finished]:
        """Text deltas, then one :class:`Finished`.  Waits for the engine if another request has it."""
        received = time.perf_counter()
        self.metrics.waiting.inc()
        with self._lock:
            self.metrics.waiting.dec()
            self.metrics.running.inc()
            try:
                yield from self._generate(prompt, config, max_tokens, stop, received)
            finally:
                self.metrics.running.dec()

    def _generate(self, prompt: tuple[list[int], list[int]], config: KVCacheConfig, max_tokens: int,
                  stop: Sequence[str], received: float) -> Iterator[Delta | Finished]:
        tokens = self.engine.stream(*prompt, config, max_tokens, stop)
        prompt_tokens = len(prompt[0]) + len(prompt[1])
        prefix = next(tokens)
        assert isinstance(prefix, ServedPrefix)
        ids: list[int] = []
        sent = ""
        finish = None
        first_at = None
        hold = max((len(s) for s in stop), default=1) - 1
        for token in tokens:
            assert isinstance(token, int)
            if first_at is None:
                first_at = time.perf_counter()
                self.metrics.ttft.observe(first_at - received)
            ids.append(token)
            if token in self.engine.stop_ids:
                finish = "stop"
                break
            text, stopped = self._text(ids, stop)
            # Hold back what may still become a stop string or is half a multi-byte character.
            ready = text if stopped else text[:max(len(sent), len(text) - hold)].rstrip("\ufffd")
            if len(ready) > len(sent):
                yield Delta(ready[len(sent):])
                sent = ready
            if stopped:
                finish = "stop"
                break
        # The engine also stops by itself: at max_tokens, or on a stop string.
        finish = finish or ("length" if len(ids) >= max_tokens else "stop")
        text, _ = self._text(ids, stop)
        if len(text) > len(sent):
            yield Delta(text[len(sent):])
        done = time.perf_counter()
        if first_at is not None and len(ids) > 1:
            self.metrics.tpot.observe((done - first_at) / (len(ids) - 1))
        self.metrics.prompt_tokens.inc(prompt_tokens)
        self.metrics.generation_tokens.inc(len(ids))
        compressed = prefix.compressed
        self.metrics.last_ratio.set(compression_ratio(compressed.baseline_bytes, compressed.physical_bytes))
        yield Finished(finish_reason=finish, prompt_tokens=prompt_tokens, completion_tokens=len(ids), kv_cache={
            "config": config.label, "settings": config.model_dump(mode="json"),
            "context_tokens": prefix.prefix_tokens, "kept_tokens": compressed.kept_tokens,
            "kept_fraction": compressed.kept_fraction, "baseline_bytes": compressed.baseline_bytes,
            "physical_bytes": compressed.physical_bytes, "analytic_bytes": compressed.analytic_bytes,
            "peak_bytes": compressed.cache.peak_bytes, "prefill_s": prefix.prefill_s,
            "compress_s": compressed.compress_s,
        })
