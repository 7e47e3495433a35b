"""``kvlab serve``'s embedded engine: one request at a time, through the cache layouts of an evaluation, its tokens
yielded as they are decoded.

:class:`StreamingEngine` is the evaluation's :class:`~kvlab.engines.embedded.EmbeddedEngine` (the playground runs
its items through it) with what a served request needs besides: :meth:`~StreamingEngine.stream` prefills and
compresses the prompt as an evaluation does, scores the prompt's tokens where asked (``prompt_logprobs``), and yields
the generated token ids one by one; :meth:`~StreamingEngine.forced_logprobs` gives a config's full rows over a
continuation, the exact KL the sampled estimator is checked against.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass
from typing import cast

import torch

from kvlab.compress.cache import KVLabCache
from kvlab.compress.eviction import scorer_key
from kvlab.core.errors import ConfigError
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.batched_decode import finished, teacher_forced
from kvlab.engines.embedded import CompressedPrefill, EmbeddedEngine, prompt_layouts
from kvlab.engines.prompt_scoring import GREEDY, PromptScorer, PromptScores, Sampling

#: Prefix positions turned into logits at once when a served prompt is scored (a ``[tokens, vocab]`` float32 slice).
HEAD_CHUNK = 256


@dataclass
class ServedPrefix:
    """What :meth:`StreamingEngine.stream` reports once the prompt is in the (compressed) cache."""

    compressed: CompressedPrefill
    prefill_s: float


class StreamingEngine(EmbeddedEngine):
    """The embedded engine that also serves requests, one at a time (``kvlab serve``'s)."""

    @torch.no_grad()
    def stream(self, context: list[int], question: list[int], config: KVCacheConfig, max_new_tokens: int,
               stop: Sequence[str] = (), forced: Sequence[int] = (), sampling: Sampling = GREEDY,
               prompt_logprobs: int | None = None, prompt_scorer: PromptScorer | None = None
               ) -> Generator[int | ServedPrefix | PromptScores, None, None]:
        """Serve one request with the same cache layouts as :meth:`evaluate`: the context is
        compressed before the question is seen, or -- query-aware -- with all but the last question
        token in the prefill, the question never evicted.  A server that cannot tell context from
        question passes all but the last prompt token as ``context``.  ``forced``: more prompt tokens
        after the question, teacher-forced through the cache the config leaves as its own decoding would
        feed them (:func:`teacher_forced`; its decode policy compresses on the way), before generation.
        Yields a :class:`ServedPrefix` (the cache right after compression); with ``prompt_logprobs``
        (top tokens per position, vLLM's field) the prompt's :class:`PromptScores` (or ``prompt_scorer``'s:
        some of its tokens, their rows too); then the generated token ids (``sampling``: greedy or seeded).
        The prefix's positions are scored by the prefill itself (before compression); the question's and
        ``forced``'s through the compressed cache.  Not thread-safe: callers serialize requests."""
        if not question:
            raise ConfigError("a served prompt needs at least one token")
        prefix, suffix = prompt_layouts(context, question)[config.query_aware]
        if prompt_scorer is None and prompt_logprobs is not None:
            prompt_scorer = PromptScorer([*context, *question, *forced], prompt_logprobs)
        key = scorer_key(config)
        self.current_config = config.label
        try:
            hidden = prompt_scorer is not None and prompt_scorer.wants(0, len(prefix))
            prefill = self._prefill(prefix, {key}, hidden=hidden)
            if prompt_scorer is not None and prefill.hidden is not None:
                for start in range(0, prefill.hidden.shape[1], HEAD_CHUNK):
                    if prompt_scorer.wants(start, HEAD_CHUNK):
                        prompt_scorer.add(start, self._head(prefill.hidden[0, start:start + HEAD_CHUNK]))
            compressed = self._compress(config, prefill.scores_for(config), prefill.keys, prefill.values,
                                        len(prefix), len(context))
            prefill_s = prefill.prefill_s + prefill.scorer_s(config)
            del prefill
            self.phase, self._live_cache = "decode", compressed.cache
            yield ServedPrefix(compressed=compressed, prefill_s=prefill_s)
            keep = 0 if prompt_scorer is not None else 1  # every position's logits only when they are scored
            compressor = self._compressor([config], [compressed.cache])
            with compressor.attached() if compressor is not None else nullcontext():
                position = len(prefix)
                positions = torch.arange(position, position + len(suffix), device=self.device).unsqueeze(0)
                logits = self.model(input_ids=torch.tensor([suffix], device=self.device),
                                    past_key_values=compressed.cache, position_ids=positions,
                                    logits_to_keep=keep).logits[0]
                if prompt_scorer is not None:
                    prompt_scorer.add(position, logits)
                position += len(suffix)
                if forced:
                    if compressor is not None:  # from here on a pass of n tokens counts n decode steps
                        compressor.fork(compressed.cache, compressed.cache)
                    for done, logits in teacher_forced(self.model, compressed.cache, forced, position, self.device,
                                                       compressor, keep):
                        if prompt_scorer is not None:
                            prompt_scorer.add(position + done, logits)
                    position += len(forced)
                if prompt_scorer is not None:
                    yield prompt_scorer.scores()
                yield from self._generate_ids(compressed.cache, logits[-1], position, max_new_tokens, stop,
                                              sampling.picker(self.device))
        finally:
            self.phase, self.current_config, self._live_cache = "idle", None, None

    def forced_logprobs(self, context: list[int], question: list[int], forced: list[int],
                        config: KVCacheConfig) -> torch.Tensor:
        """``config``'s log-probabilities of each token of ``forced`` (``[len(forced), vocab]``, float32) fed after
        the prompt as :meth:`stream` feeds it (``kvlab serve``'s ``prompt_logprobs`` read these rows): the exact
        KL(p_baseline || p_config) at each position of a continuation is the sum over its row."""
        scorer = PromptScorer([*context, *question, *forced], 0, first=len(context) + len(question), rows=True)
        with closing(self.stream(context, question, config, 1, forced=forced, prompt_scorer=scorer)) as events:
            for event in events:
                if isinstance(event, PromptScores):
                    assert event.rows is not None  # the scorer keeps them
                    return event.rows
        raise RuntimeError("the prompt was not scored")

    def _generate_ids(self, cache: KVLabCache, logits: torch.Tensor, position: int, max_new_tokens: int,
                      stop: Sequence[str], pick: Callable[[torch.Tensor], int]) -> Iterator[int]:
        """Decoding, one token id at a time (the first picked from ``logits``; ``pick``: greedy or a
        request's seeded sampler, :class:`Sampling`), until an end token, a stop string or
        ``max_new_tokens``.  The end token itself is yielded too."""
        generated: list[int] = []
        while True:
            next_id = pick(logits)
            generated.append(next_id)
            yield next_id
            if finished(generated, self.stop_ids, max_new_tokens, stop, self.tokenizer.decode):
                return
            out = self.model(input_ids=torch.tensor([[next_id]], device=self.device), past_key_values=cache,
                             position_ids=torch.tensor([[position]], device=self.device))
            position += 1
            logits = out.logits[0, -1]

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits from its last (normed) hidden states, as its own forward computes them."""
        logits = cast(torch.nn.Module, self.model.get_output_embeddings())(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits
