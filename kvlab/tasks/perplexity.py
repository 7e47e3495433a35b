"""Perplexity: a haystack context and the text that follows it.

The context is a window of haystack prose fitted to the target length; the
continuation is the next words of the same text (so never part of the context),
fitted to at most ``continuation_tokens`` tokens and starting with a space so that
``context + continuation`` reads as the original text. The engine measures the
continuation's negative log-likelihood given the (compressed) context cache.

Chance floor: none (not a 0-1 score); compare perplexities with the baseline's.
"""

from __future__ import annotations

from functools import partial

from kvlab.core.items import TaskItem
from kvlab.core.tasks import PerplexityParams, TaskSpec
from kvlab.tasks.haystack import Tokenizer, fit_to_length, haystack_prompt, item_slots, load_haystack, render_context


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` items per context length."""
    params = spec.params_as(PerplexityParams)
    haystack = load_haystack()
    items = []
    for slot in item_slots("perplexity", spec.context_lengths, spec.items_per_length, seed):
        prompt = haystack_prompt(slot, tokenizer, "", "")
        continuation = fit_to_length(tokenizer, params.continuation_tokens, "",
                                     partial(render_context, haystack, " ", prompt.start + prompt.fitted.n_words))
        items.append(TaskItem(
            task="perplexity", item_id=slot.item_id, context=prompt.fitted.context, question="", answer="",
            context_length=slot.length, depth=None, max_new_tokens=0, kind="perplexity",
            continuation=continuation.context,
            metadata=prompt.metadata(continuation_tokens=continuation.context_tokens),
        ))
    return items
