"""Passkey retrieval (needle in a haystack), completion style.

Prompt: instruction, haystack prose with the needle
"The pass key is 71432. Remember it. 71432 is the pass key." as its own paragraph at the item's depth,
then "\\nWhat is the pass key? The pass key is". Completion style, not chat: the
135M default model fails chat-style needle prompts even with an uncompressed cache,
and scores 5/5 on this prompt at 1k tokens (depths 0.1-0.9, greedy, float32).

Chance floor: about 0 (a guess of the random 5-digit key is right once in 90,000); the key is
the only number in the context, so the task tests retrieval over distance, not disambiguation.
"""

from __future__ import annotations

from kvlab.core.items import TaskItem
from kvlab.core.tasks import PasskeyParams, TaskSpec, task_new_tokens
from kvlab.tasks.haystack import Needle, Tokenizer, haystack_prompt, item_slots, token_depth

PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about the important information there.\n\n"
)
QUESTION = "\nWhat is the pass key? The pass key is"
ANSWER_STOP = (".", "\n")  # the number is complete at its full stop
DEFAULT_MAX_NEW_TOKENS = task_new_tokens("passkey")


def needle_text(key: str) -> str:
    """The needle as a paragraph of its own: SmolLM2-135M finds it at 2K tokens 10/10 this way,
    7/10 when it runs on inside a paragraph of the haystack."""
    return f"\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` items per context length; depths assigned round-robin."""
    params = spec.params_as(PasskeyParams)
    items = []
    for slot in item_slots("passkey", spec.context_lengths, spec.items_per_length, seed, params.depths):
        key = str(slot.rng.randint(10_000, 99_999))
        needle = Needle(needle_text(key), slot.needle_depth)
        prompt = haystack_prompt(slot, tokenizer, PREFIX, QUESTION, [needle])
        items.append(TaskItem(
            task="passkey", item_id=slot.item_id, context=prompt.fitted.context, question=QUESTION, answer=key,
            context_length=slot.length, depth=slot.depth,
            max_new_tokens=spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, stop=ANSWER_STOP,
            metadata=prompt.metadata(needle_token_depth=token_depth(tokenizer, prompt.fitted.context, needle.text)),
        ))
    return items
