"""A task that exists nowhere in kvlab, with parameters of its own: random words, the answer is the last
``asked`` of them.  Its module is all a new task needs beside its registry entry (in
``tests/tasks/test_task_registry.py``): its parameter model and its generator; its answers are scored by
one of kvlab's scorers (``kvlab.tasks.scoring:answer_prefix``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvlab.core.items import TaskItem
from kvlab.core.tasks import TaskParams, TaskSpec
from kvlab.tasks.haystack import Tokenizer, fit_to_length, item_slots

VOCABULARIES = {"fruit": ("apple", "pear", "plum", "cherry", "lemon", "melon"),
                "nature": ("river", "stone", "cloud", "meadow", "forest", "valley")}


class LastWordsParams(TaskParams):
    """lastwords: how many words are asked for, from which vocabulary, in capitals or not."""

    asked: int = Field(default=1, ge=1, le=4, title="Words asked",
                       description="How many of the text's last words the answer lists.")
    vocabulary: Literal["fruit", "nature"] = Field(default="fruit", title="Vocabulary",
                                                   description="The words the text is made of.")
    capitals: bool = Field(default=False, title="Capitals", description="The words in capital letters.")


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """Random words fitted to each context length; the answer is the last ``asked`` of them."""
    params = spec.params_as(LastWordsParams)
    question = f"\nThe last {params.asked} words of the text above are"
    items = []
    for slot in item_slots("lastwords", spec.context_lengths, spec.items_per_length, seed):
        words = [slot.rng.choice(VOCABULARIES[params.vocabulary]) for _ in range(slot.length)]
        words = [word.upper() for word in words] if params.capitals else words
        fitted = fit_to_length(tokenizer, slot.length, question, lambda n, words=words: " ".join(words[:n + 1]))
        last = fitted.n_words + 1
        items.append(TaskItem(
            task="lastwords", item_id=slot.item_id, context=fitted.context, question=question,
            answer=" ".join(words[max(0, last - params.asked):last]), context_length=slot.length, depth=None,
            max_new_tokens=spec.max_new_tokens or 3 * params.asked, metadata={"prompt_tokens": fitted.prompt_tokens},
        ))
    return items
