"""Multi-key needle retrieval (RULER niah_multikey style), completion style.

``num_pairs`` lines "The special magic number for <adjective-noun> is: 1234567." are
scattered through the haystack; the question asks for one of them. The queried pair
sits at the item's depth; its rank among the numbers is drawn uniformly and independently
of that depth (the distractors before it at random depths above, the rest below), so
"answer with the first number" or "with the last one" is right on about ``1 / num_pairs``
of the items at every depth.  Those shortcuts' scores are measured on every item
(:func:`shortcut_scores`) and reported next to the baseline's accuracy.

Chance floor: ``1 / num_pairs`` (naming one of the context's numbers without reading the keys).

Default ``num_pairs = 4``: uncompressed SmolLM2-135M at 1k tokens scores 8/10 with 4
pairs (as with 2; its misses are mostly the last pair's number), but 3/5 with 10
pairs and 0/10 with 40, which would leave little room to see compression hurt.
"""

from __future__ import annotations

from kvlab.core.items import TaskItem
from kvlab.core.tasks import MultikeyParams, TaskSpec, task_new_tokens
from kvlab.tasks.haystack import Needle, Tokenizer, haystack_prompt, item_slots, token_depth

PREFIX = (
    "Some special magic numbers are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the numbers afterwards.\n\n"
)
ANSWER_STOP = (".", "\n")  # the number is complete at its full stop
DEFAULT_MAX_NEW_TOKENS = task_new_tokens("multikey")

ADJECTIVES = (
    "amber",
    "ancient",
    "bitter",
    "brave",
    "bright",
    "calm",
    "clever",
    "cold",
    "crimson",
    "curious",
    "dusty",
    "eager",
    "early",
    "fancy",
    "gentle",
    "golden",
    "grand",
    "green",
    "hidden",
    "hollow",
    "humble",
    "icy",
    "jolly",
    "lazy",
    "little",
    "lively",
    "lucky",
    "misty",
    "modern",
    "noble",
    "old",
    "pale",
    "proud",
    "quiet",
    "rapid",
    "rustic",
    "silent",
    "silver",
    "simple",
    "sleepy",
    "smooth",
    "sturdy",
    "sunny",
    "swift",
    "tall",
    "tender",
    "vivid",
    "warm",
    "wild",
    "wise",
)
NOUNS = (
    "anchor",
    "apple",
    "badger",
    "banner",
    "basket",
    "beacon",
    "bridge",
    "candle",
    "canyon",
    "castle",
    "cedar",
    "comet",
    "cottage",
    "falcon",
    "feather",
    "forest",
    "fountain",
    "garden",
    "glacier",
    "harbor",
    "hammer",
    "island",
    "jacket",
    "kettle",
    "ladder",
    "lantern",
    "meadow",
    "mirror",
    "mountain",
    "needle",
    "orchard",
    "otter",
    "pebble",
    "pepper",
    "piano",
    "pillow",
    "pond",
    "river",
    "saddle",
    "shadow",
    "spoon",
    "thunder",
    "tiger",
    "tower",
    "violin",
    "wagon",
    "walnut",
    "window",
    "wizard",
    "yarn",
)


def needle_text(key: str, value: str) -> str:
    return f"The special magic number for {key} is: {value}."


def question_text(key: str) -> str:
    return (
        f"\nWhat is the special magic number for {key} mentioned in the provided text? "
        f"The special magic number for {key} mentioned in the provided text is"
    )


def shortcut_scores(item: TaskItem) -> dict[str, float]:
    """What answering with the context's first or last number would score on ``item``."""
    numbers = item.metadata["numbers_in_order"]
    return {"first number": float(numbers[0] == item.answer), "last number": float(numbers[-1] == item.answer)}


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` contexts per context length; the queried pair's depth is round-robin.

    With ``questions_per_context = k`` each context is asked about k of its keys, one item each
    (``<context id>/q<rank>``, sharing the ``context_id``): the first key at the slot's depth, as
    with one question, the others wherever they were drawn (``metadata["key_depth"]``; their item's
    ``depth`` is None, so the depth heatmap keeps to the spec's depths)."""
    params = spec.params_as(MultikeyParams)
    items = []
    asked = params.questions_per_context
    for slot in item_slots("multikey", spec.context_lengths, spec.items_per_length, seed, params.depths):
        rng, depth = slot.rng, slot.needle_depth
        pairs = rng.sample(range(len(ADJECTIVES) * len(NOUNS)), params.num_pairs)
        keys = [f"{ADJECTIVES[p // len(NOUNS)]}-{NOUNS[p % len(NOUNS)]}" for p in pairs]
        values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), params.num_pairs)]
        rank = rng.randrange(params.num_pairs)  # the target's place among the numbers
        before = sorted(rng.uniform(0.0, depth) for _ in range(rank))
        after = sorted(rng.uniform(depth, 1.0) for _ in range(params.num_pairs - 1 - rank))
        order = [*keys[1 : rank + 1], keys[0], *keys[rank + 1 :]]
        depths = dict(zip(order, [*before, depth, *after], strict=True))
        by_key = dict(zip(keys, values, strict=True))
        # In this order, with depths that never decrease: needles at one break keep it.
        needles = [Needle(needle_text(k, by_key[k]), depths[k]) for k in order]
        prompt = haystack_prompt(slot, tokenizer, PREFIX, question_text(keys[0]), needles)
        numbers = [by_key[k] for k in order]
        for question_rank, key in enumerate(keys[:asked]):
            target_depth = token_depth(tokenizer, prompt.fitted.context, needle_text(key, by_key[key]))
            items.append(TaskItem(
                task="multikey", item_id=slot.item_id if asked == 1 else f"{slot.item_id}/q{question_rank}",
                context=prompt.fitted.context, question=question_text(key), answer=by_key[key],
                context_length=slot.length, depth=depth if question_rank == 0 else None,
                max_new_tokens=spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, stop=ANSWER_STOP,
                context_id=slot.item_id if asked > 1 else None, question_rank=question_rank,
                multi_turn=params.multi_turn,
                metadata=prompt.metadata(needle_token_depth=target_depth, key=key, num_pairs=params.num_pairs,
                                         target_rank=order.index(key), numbers_in_order=numbers,
                                         **({"key_depth": depths[key]} if asked > 1 else {})),
            ))
    return items
