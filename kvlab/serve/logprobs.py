"""vLLM's ``prompt_logprobs`` shape, from the engine's :class:`~kvlab.engines.prompt_scoring.PromptScores`.

vLLM 0.32 (``vllm/logprobs.py``, ``vllm/v1/engine/logprobs.py``): one entry per prompt token, ``None`` for
the first (``create_prompt_logprobs``), then a dict keyed by token id (a string in JSON) of
``{"logprob", "rank", "decoded_token"}`` (the ``Logprob`` dataclass): the prompt's own token first, with its
rank (``batched_count_greater_than``: how many tokens score at least as high), then the top ``k`` with ranks
1..k (``append_logprobs_for_next_position``: the prompt's token, when among them, keeps its first place
and takes its top-k rank).  A log-probability of ``-inf`` is sent as ``-9999.0``
(``clamp_prompt_logprobs``).  ``decoded_token`` is the token decoded alone, its leading space restored for
SentencePiece vocabularies (``convert_ids_list_to_tokens``); vLLM's repair of half UTF-8 characters from
the tokens before is not done here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from kvlab.engines.prompt_scoring import PromptScores

#: The most top tokens per position vLLM returns by default (its ``--max-logprobs``); kvlab serve's limit too.
MAX_LOGPROBS = 20
#: What vLLM sends in place of a log-probability of ``-inf``.
CLAMPED = -9999.0


def _clamp(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else CLAMPED


def _space_marker(tokenizer: Any) -> str | None:
    """The Metaspace replacement character of a SentencePiece-style tokenizer (vLLM's
    ``get_leading_space_marker``), whose leading instance ``decode`` drops; None for byte-level ones."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    except (ValueError, AttributeError):
        return None
    for part in [pre, *(pre.get("pretokenizers") or [])]:
        if part.get("type") == "Metaspace":
            return str(part.get("replacement", "\u2581"))
    return None


class TokenText:
    """Each token id's ``decoded_token`` as vLLM writes it, remembered per id."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.marker = _space_marker(tokenizer)
        self._known: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        if (text := self._known.get(token)) is None:
            text = self.tokenizer.decode([token]) or ""
            if self.marker is not None:
                raw = self.tokenizer.convert_ids_to_tokens([token])[0] or ""
                missing = (len(raw) - len(raw.lstrip(self.marker))) - (len(text) - len(text.lstrip(" ")))
                text = " " * missing + text if missing > 0 else text
            self._known[token] = text
        return text


def vllm_prompt_logprobs(scores: PromptScores, ids: Sequence[int],
                         tokenizer: Any) -> list[dict[str, dict[str, Any]] | None]:
    """``choices[0].prompt_logprobs`` of a completion whose prompt is ``ids``."""
    text = TokenText(tokenizer)
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    for index, token in enumerate(ids[1:]):
        entry = {str(token): {"logprob": _clamp(scores.token_logprobs[index]), "rank": scores.ranks[index],
                              "decoded_token": text(token)}}
        for rank, (top, logprob) in enumerate(zip(scores.top_ids[index], scores.top_logprobs[index], strict=True),
                                              start=1):
            entry[str(top)] = {"logprob": _clamp(logprob), "rank": rank, "decoded_token": text(top)}
        entries.append(entry)
    return entries
