"""One served request: prompt tokens in, text deltas out, with OpenAI's stop-string semantics.

Text is streamed as soon as it cannot turn into a stop string any more, and the stop string
itself is never sent -- what OpenAI and vLLM do.  Generation is synchronous and checks a cancel
flag at every attention layer of the model, so a request whose client went away, or a server that
is stopping, frees the engine within one layer's time, even in the middle of a long prefill.
Who may use the engine when is :mod:`kvlab.serve.engine_thread`'s business.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

from torch import nn

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import MEASURED_SERVED, KeptPositions, KVMeasurement
from kvlab.engines.embedded_streaming import ServedPrefix, StreamingEngine
from kvlab.engines.prompt_scoring import GREEDY, PromptScores, Sampling
from kvlab.serve.logprobs import vllm_prompt_logprobs
from kvlab.serve.metrics import ServerMetrics


@dataclass(frozen=True)
class ServedPrompt:
    """A request's prompt as the engine lays it out: the ``context`` (compressed by the config), the
    ``question`` (fed after compression, or in the scorer's window when query-aware) and ``forced``, the
    rest (teacher-forced through the cache the config leaves, before generation: a continuation to score)."""

    context: list[int]
    question: list[int]
    forced: list[int] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return [*self.context, *self.question, *self.forced]

    @property
    def split(self) -> list[int]:
        """kvlab's ``kv_cache_prompt_split``: ``[context tokens, question tokens]`` (the rest is ``forced``)."""
        return [len(self.context), len(self.question)]

    def __len__(self) -> int:
        return len(self.context) + len(self.question) + len(self.forced)


@dataclass(frozen=True)
class Decoding:
    """What a request asks of generation beyond its prompt and config."""

    max_tokens: int
    stop: list[str] = field(default_factory=list)
    sampling: Sampling = GREEDY
    prompt_logprobs: int | None = None  # vLLM's: score the prompt, with this many top tokens per position
    positions: bool = False  # report the prompt positions each head kept (a token map)


@dataclass
class Started:
    """The prompt is in the (compressed) cache: the first token comes next."""


@dataclass
class Delta:
    text: str
    token_ids: list[int] = field(default_factory=list)  # the tokens generated since the last delta


@dataclass
class Finished:
    finish_reason: str  # "stop" (end token or stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    config: KVCacheConfig
    kv: KVMeasurement
    prefill_s: float  # the prefill and this config's eviction scorer
    compress_s: float
    positions: KeptPositions | None = None  # what each head kept of the prompt, when the request asked
    prompt: ServedPrompt | None = None
    token_ids: list[int] = field(default_factory=list)  # every generated token (an end token too), as vLLM's
    #: vLLM's ``prompt_logprobs`` (:func:`kvlab.serve.logprobs.vllm_prompt_logprobs`), when the request asked
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None

    @property
    def kv_cache(self) -> dict[str, Any]:
        """The response's ``kv_cache`` block: the config, the measurement (:meth:`KVMeasurement.to_dict`,
        which the ``openai_compat`` engine reads back), the server-side prefill and compression times, and
        the kept positions when asked (``kept_positions``: :meth:`KeptPositions.to_dict`)."""
        return {"config": self.config.label, "settings": self.config.model_dump(mode="json"), **self.kv.to_dict(),
                "prefill_s": self.prefill_s, "compress_s": self.compress_s} | (
            {"kept_positions": self.positions.to_dict()} if self.positions is not None else {})


Event = Started | Delta | Finished


class Cancelled(Exception):
    """Raised inside the model's forward pass to abandon a cancelled request."""


@contextmanager
def stop_between_layers(modules: Sequence[nn.Module], cancelled: Callable[[], bool]) -> Iterator[None]:
    """Raise :class:`Cancelled` at the next attention layer once ``cancelled()``: a prefill of
    thousands of tokens takes seconds, and so stops within one layer's time."""
    def check(module: nn.Module, args: tuple[Any, ...]) -> None:
        if cancelled():
            raise Cancelled

    handles = [module.register_forward_pre_hook(check) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _max_prompt_chars(tokenizer: Any, max_model_len: int) -> int | None:
    """The most characters a prompt that fits the context can have (tokens x the longest token),
    so that a longer one is refused without seconds of tokenizing.  Known only for a fast
    tokenizer without a normalizer, whose tokens each cover at most their own length of input."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not max_model_len or backend is None or backend.normalizer is not None:
        return None
    longest = max(len(token) for token in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    return max_model_len * longest


class ServedModel:
    """The embedded engine, its served name and default KV config, and the server's metrics."""

    def __init__(self, engine: StreamingEngine, name: str, default_config: KVCacheConfig):
        self.engine = engine
        self.name = name
        self.default_config = default_config
        self.max_model_len = engine.max_context
        # an embedding layer (transformers types it as a plain module)
        self.vocab_size = int(cast(nn.Embedding, engine.model.get_input_embeddings()).num_embeddings)
        self.max_prompt_chars = _max_prompt_chars(self.tokenizer, self.max_model_len)
        self.metrics = ServerMetrics(name, engine.current_kv_bytes)
        self.stopping = threading.Event()  # set when the server shuts down: every generation ends

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

    def generate(self, prompt: ServedPrompt, config: KVCacheConfig, decoding: Decoding, cancel: threading.Event,
                 received: float) -> Iterator[Event]:
        """:class:`Started`, text deltas, then one :class:`Finished` -- or nothing more once
        ``cancel`` or :attr:`stopping` is set (checked at every attention layer).  The caller must
        hold the engine (one request at a time); ``received`` is when the request arrived
        (``time.perf_counter()``), for TTFT."""
        self.metrics.running.inc()
        try:
            yield from self._generate(prompt, config, decoding, cancel, received)
        finally:
            self.metrics.running.dec()

    def _generate(self, prompt: ServedPrompt, config: KVCacheConfig, decoding: Decoding, cancel: threading.Event,
                  received: float) -> Iterator[Event]:
        def cancelled() -> bool:
            return cancel.is_set() or self.stopping.is_set()

        stop, max_tokens = decoding.stop, decoding.max_tokens
        ids: list[int] = []
        sent, sent_ids = "", 0
        finish = None
        first_at = None
        scores: PromptScores | None = None
        hold = max((len(s) for s in stop), default=1) - 1
        tokens = self.engine.stream(prompt.context, prompt.question, config, max_tokens, stop, forced=prompt.forced,
                                    sampling=decoding.sampling, prompt_logprobs=decoding.prompt_logprobs)
        try:
            with stop_between_layers(self.engine.modules, cancelled), closing(tokens):  # closing frees the cache
                prefix = next(tokens)
                assert isinstance(prefix, ServedPrefix)
                yield Started()
                for token in tokens:
                    if isinstance(token, PromptScores):
                        scores = token
                        continue
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
                        yield Delta(ready[len(sent):], ids[sent_ids:])
                        sent, sent_ids = ready, len(ids)
                    if stopped:
                        finish = "stop"
                        break
        except Cancelled:
            return
        # The engine also stops by itself: at max_tokens, or on a stop string.
        finish = finish or ("length" if len(ids) >= max_tokens else "stop")
        text, _ = self._text(ids, stop)
        if len(text) > len(sent):
            yield Delta(text[len(sent):], ids[sent_ids:])
        done = time.perf_counter()
        if first_at is not None and len(ids) > 1:
            self.metrics.tpot.observe((done - first_at) / (len(ids) - 1))
        self.metrics.prompt_tokens.inc(len(prompt))
        self.metrics.generation_tokens.inc(len(ids))
        kv = replace(prefix.compressed.measured(), source=MEASURED_SERVED)
        ratio = kv.compression_ratio
        assert ratio is not None  # the embedded engine measures both the baseline's size and the cache's
        self.metrics.last_ratio.set(ratio)
        yield Finished(finish_reason=finish, prompt_tokens=len(prompt), completion_tokens=len(ids), config=config,
                       kv=kv, prefill_s=prefix.prefill_s, compress_s=prefix.compressed.compress_s,
                       positions=self.engine.kept_positions(prefix.compressed) if decoding.positions else None,
                       prompt=prompt, token_ids=ids,
                       prompt_logprobs=(vllm_prompt_logprobs(scores, prompt.ids, self.tokenizer)
                                        if scores is not None else None))
