"""Variable tracking (RULER vt), completion style.

Each chain is ``num_hops + 1`` statements "VAR QPWXZ = 12345." then
"VAR KJHGF = VAR QPWXZ." and so on, in order at increasing random depths of the
haystack; ``num_chains - 1`` further chains with other values are distractors (3 by
default, so an answer must tell the chains apart).  The question asks for every variable
holding the first chain's value (RULER's form); the answer is those names, space-separated,
and the score is the F1 of the variable names the output mentions against them: an extra
name costs precision, so listing every name in the context does not pass.

Chance floor: listing every variable of the context scores ``2 / (num_chains + 1)`` (0.4 with
4 chains; measured per item by :func:`shortcut_scores`), naming one chain at random ``1 / num_chains``.

This is beyond a 135M model: uncompressed SmolLM2-135M recalls 0.2-0.45 of the
names at 1k tokens (5 items; 0.44 with a BOS token, 0.20 without; 0.27 with
``num_hops=2``), and a single-answer form ("what is the value of VAR X?") scored
0-0.2, so the standard form and RULER's defaults are kept.
Read it as a relative measure on SmolLM2, an absolute one on bigger models.
"""

from __future__ import annotations

import random
import string

from kvlab.core.items import TaskItem
from kvlab.core.tasks import TaskSpec, VariableTrackingParams
from kvlab.tasks.haystack import Needle, Tokenizer, haystack_prompt, item_slots
from kvlab.tasks.scoring import variable_names

PREFIX = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"


def question_text(value: str, num_names: int) -> str:
    return (
        f"\nQuestion: Find all variables that are assigned the value {value} in the text "
        "above. Answer: According to the chain(s) of variable assignment in the text above, "
        f"{num_names} variables are assigned the value {value}, they are:"
    )


def default_max_new_tokens(num_hops: int) -> int:
    """12 tokens per name: small models answer "1. VAR ABCDE = 12345. 2. ..." verbosely."""
    return 12 * (num_hops + 1) + 8


def _names(rng: random.Random, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names and name != "VAR":
            names.append(name)
    return names


def _chain(names: list[str], value: str) -> list[str]:
    first = f"VAR {names[0]} = {value}."
    return [first] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:], strict=False)]


def shortcut_scores(item: TaskItem) -> dict[str, float]:
    """What listing every variable name of the context would score on ``item``."""
    return {"every name": variable_names(item, " ".join(item.metadata["all_names"]))}


def generate(spec: TaskSpec, tokenizer: Tokenizer, seed: int) -> list[TaskItem]:
    """``num_items`` items per context length."""
    params = spec.params_as(VariableTrackingParams)
    per_chain = params.num_hops + 1
    items = []
    for slot in item_slots("variable_tracking", spec.context_lengths, spec.items_per_length, seed):
        names = _names(slot.rng, params.num_chains * per_chain)
        values = [str(v) for v in slot.rng.sample(range(10_000, 100_000), params.num_chains)]
        needles = []
        for c, value in enumerate(values):
            chain_names = names[c * per_chain : (c + 1) * per_chain]
            depths = sorted(slot.rng.random() for _ in chain_names)
            needles += [Needle(s, d) for s, d in zip(_chain(chain_names, value), depths, strict=True)]
        needles.sort(key=lambda n: n.depth)  # stable: a chain's statements stay in order
        question = question_text(values[0], per_chain)
        prompt = haystack_prompt(slot, tokenizer, PREFIX, question, needles)
        items.append(TaskItem(
            task="variable_tracking", item_id=slot.item_id, context=prompt.fitted.context, question=question,
            answer=" ".join(names[:per_chain]), context_length=slot.length, depth=None,
            max_new_tokens=spec.max_new_tokens or default_max_new_tokens(params.num_hops),
            metadata=prompt.metadata(value=values[0], num_chains=params.num_chains, num_hops=params.num_hops,
                                     all_names=names),
        ))
    return items
