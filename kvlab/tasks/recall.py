"""Passage recall: reproduce a passage of the context, given its opening -- a long answer whose every
token depends on the cache.

Prompt: instruction, haystack prose with the passage -- ``passage_words`` words, pairs of an adjective
and a noun drawn at random (``amber castle, calm badger, ...``), as its own paragraph at the item's
depth -- then "Repeat the secret list word for word." and the list's first two pairs, which the model
continues.  Random words, not prose, so that no model can answer from memory (the haystack is a
published novel), and pairs of common words, which small tokenizers keep whole.  The answer is the
rest of the list, and the default generation budget is half as long again as its tokens, so an output
is hundreds of tokens for a long passage: what an evicted or coarsely quantized cache lost shows up
word by word, not as a single wrong number.

Score: the fraction of the answer's words that the output reproduces in order (the longest common
subsequence of the two word sequences, over the answer's length), after normalising both (lowercase,
punctuation dropped).  Chance floor: a few percent -- any list of the vocabulary's words shares a
short subsequence with the passage; the shortcuts below measure two such lists on each item.
"""

from __future__ import annotations

from kvlab.core.items import TaskItem
from kvlab.core.tasks import RecallParams, TaskSpec
from kvlab.tasks.haystack import Needle, Tokenizer, count_tokens, haystack_prompt, item_slots, token_depth
from kvlab.tasks.multikey import ADJECTIVES, NOUNS
from kvlab.tasks.scoring import normalize

PREFIX = (
    "There is a secret list hidden inside a lot of irrelevant text. Find it and memorize it word for word. "
    "I will ask you to repeat it.\n\n"
)
OPENING_PAIRS = 2  # the pairs the question gives away
STOP = ("\n",)  # the list is one line


def passage_words(rng_choice, count: int) -> list[str]:
    """``count`` words alternating an adjective and a noun, each drawn by ``rng_choice``."""
    return [rng_choice(ADJECTIVES if index % 2 == 0 else NOUNS) for index in range(count)]


def as_list(words: list[str]) -> str:
    """``amber castle, calm badger, ...``: pairs separated by commas."""
    return ", ".join(" ".join(words[i:i + 2]) for i in range(0, len(words), 2))


def in_order(reference: list[str], output: list[str]) -> int:
    """Length of the longest common subsequence of two word lists (the output cut at twice the
    reference's length: words past that cannot raise the score, only its cost)."""
    output = output[:2 * len(reference)]
    previous = [0] * (len(output) + 1)
    for word in reference:
        current = [0]
        for index, other in enumerate(output):
            current.append(previous[index] + 1 if word == other else max(previous[index + 1], current[index]))
        previous = current
    return previous[-1]


def recall_score(answer: str, generated: str) -> float:
    """The fraction of ``answer``'s words that ``generated`` reproduces in order (both normalised)."""
    reference = normalize(answer).split()
    return in_order(reference, normalize(generated).split()) / len(reference) if reference else 0.0


def score(item: TaskItem, generated: str) -> float:
    return recall_score(item.answer, generated)


def shortcut_scores(item: TaskItem) -> dict[str, float]:
    """What two answers that read no passage would score: the opening pairs over and over, and the
    vocabulary's words in its own order."""
    length = len(normalize(item.answer).split())
    opening = item.metadata["opening"].split()
    vocabulary = [word for pair in zip(ADJECTIVES, NOUNS, strict=True) for word in pair]
    return {"the opening repeated": recall_score(item.answer, " ".join((opening * length)[:length])),
            "the vocabulary in order": recall_score(item.answer, " ".join(vocabulary[:length]))}


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` items per context length; depths assigned round-robin."""
    params = spec.params_as(RecallParams)
    items = []
    for slot in item_slots("recall", spec.context_lengths, spec.items_per_length, seed, params.depths):
        words = passage_words(slot.rng.choice, params.passage_words)
        opening = as_list(words[:2 * OPENING_PAIRS])
        passage = as_list(words)
        question = f"\nRepeat the secret list word for word. The secret list: {opening},"
        answer = as_list(words[2 * OPENING_PAIRS:]) + "."
        needle = Needle(f"\n\nThe secret list: {passage}.\n\n", slot.needle_depth)
        prompt = haystack_prompt(slot, tokenizer, PREFIX, question, [needle])
        budget = spec.max_new_tokens or count_tokens(tokenizer, " " + answer) * 3 // 2 + 8
        items.append(TaskItem(
            task="recall", item_id=slot.item_id, context=prompt.fitted.context, question=question, answer=answer,
            context_length=slot.length, depth=slot.depth, max_new_tokens=budget, stop=STOP,
            metadata=prompt.metadata(needle_token_depth=token_depth(tokenizer, prompt.fitted.context, needle.text),
                                     opening=opening),
        ))
    return items
