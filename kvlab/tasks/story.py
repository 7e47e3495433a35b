"""A long generation with no reference answer: the story goes on, judged by fidelity alone.

Prompt: a window of the haystack novel, then "\\n\\nWhat happens next, in the same style and with the
same people:\\n\\n"; the model writes ``max_new_tokens`` tokens (default 256) of continuation. There
is no right answer to score, so the item has no score: a config is judged by its fidelity to the
uncompressed model on the same prompt (KL and top-1 agreement, teacher-forced on the baseline's
continuation), the criterion kvlab's verdicts already use where accuracy cannot judge.  What
eviction throws away while the continuation is written (names, places, the thread of the scene)
shows up as the continuation leaving the baseline's.

Chance floor: none (no score); shortcuts: none (nothing to guess).
"""

from __future__ import annotations

from kvlab.core.items import TaskItem
from kvlab.core.tasks import TaskSpec, task_new_tokens
from kvlab.tasks.haystack import Tokenizer, haystack_prompt, item_slots

QUESTION = "\n\nWhat happens next, in the same style and with the same people:\n\n"
DEFAULT_MAX_NEW_TOKENS = task_new_tokens("story")


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` items per context length, each a different window of the novel."""
    items = []
    for slot in item_slots("story", spec.context_lengths, spec.items_per_length, seed):
        prompt = haystack_prompt(slot, tokenizer, "", QUESTION)
        items.append(TaskItem(
            task="story", item_id=slot.item_id, context=prompt.fitted.context, question=QUESTION, answer="",
            context_length=slot.length, depth=None, max_new_tokens=spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            metadata=prompt.metadata(),
        ))
    return items
