"""kvpress's answer to an item, on the token ids kvlab's engine reads (the parity tests' reference)."""

from __future__ import annotations

import torch


def kvpress_answer(pipeline, tokenizer, item, press, max_new_tokens: int, cache=None) -> str:
    """kvpress's answer to ``item`` (the context compressed by ``press`` before the question, as kvpress
    does), on the token ids kvlab's engine reads; ``cache``: the cache kvpress fills (a fresh one if None)."""
    context = torch.tensor([tokenizer(item.context)["input_ids"]])
    question = torch.tensor([tokenizer(item.question, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return pipeline._forward({"context_ids": context, "questions_ids": [question]},
                                 max_new_tokens=max_new_tokens, press=press, cache=cache)[0]
