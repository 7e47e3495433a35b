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

from kvlab.tasks.haystack import Tokenizer, fit_to_length, load_haystack, render_context
from kvlab.tasks.items import TaskItem, item_rng
from kvlab.tasks.spec import TaskSpec


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` items per context length; ``depths`` is not used."""
    haystack = load_haystack()
    items = []
    for length in spec.context_lengths:
        for i in range(spec.num_items):
            item_id = f"perplexity/L{length}/i{i}"
            start = haystack.random_start(item_rng(seed, item_id))
            fitted = fit_to_length(
                tokenizer, length, "", partial(render_context, haystack, "", start)
            )
            after = start + fitted.n_words
            continuation = fit_to_length(
                tokenizer,
                spec.continuation_tokens,
                "",
                partial(render_context, haystack, " ", after),
            )
            items.append(
                TaskItem(
                    task="perplexity",
                    item_id=item_id,
                    context=fitted.context,
                    question="",
                    answer="",
                    context_length=length,
                    depth=None,
                    max_new_tokens=0,
                    kind="perplexity",
                    continuation=continuation.context,
                    metadata={
                        "prompt_tokens": fitted.prompt_tokens,
                        "continuation_tokens": continuation.context_tokens,
                        "haystack_start": start,
                    },
                )
            )
    return items
