"""Fidelity through a server: the sampled estimator of KL(p_baseline || p_config) from prompt log-probabilities.

KL(p || q) at a position is the expectation, over tokens y drawn from p, of log p(y) - log q(y).  So a server
that returns *the log-probability of given prompt tokens* suffices:

1. the baseline's server samples a continuation of the item's prompt at temperature 1 (seeded per item, and
   recorded: :class:`Reference`), returning the token ids of the prompt and of the continuation;
2. the baseline's server and each config's server score prompt + that continuation as one prompt
   (``prompt_logprobs``, vLLM's field, which ``kvlab serve`` answers in the same shape; a serving engine whose
   OpenAI completions cannot answer names its own API instead, :class:`~kvlab.engines.servers.base.ScoringAPI`):
   each continuation token's log-probability, and the top-1 token at each position;
3. per position, log p(y) - log q(y) is an unbiased estimate of that position's KL (one draw: it can be negative),
   and top-1 equality gives agreement.  An item's mean over its positions is an unbiased estimate of the
   item's mean KL along the baseline's sampled trajectory, so the item-level t interval of
   :mod:`kvlab.analysis.fidelity` holds as it does for the exact KL; its variance adds the sampling noise of
   one draw per position to the spread across items (``docs/concepts``: the items it needs).

This is not the embedded engine's exact KL on the baseline's *greedy* tokens: another quantity on another
trajectory.  Every :class:`~kvlab.core.results.Fidelity` says which it holds (``teacher``), and tables compare
like with like.

Prefix caching makes the scoring request cheap on vLLM: the prompt's blocks are already in the cache (the
accuracy request put them there, in the config's KV dtype, so the continuation is scored against the cache the
config stores).  The requests go through the official ``openai`` client, kvlab's fields in ``extra_body``; an
engine's own API through the same client's ``post`` (the same retries, timeouts and error types).
"""

from __future__ import annotations

import math
import threading
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai

from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.results import TEACHER_BASELINE_SAMPLE, Fidelity
from kvlab.engines.endpoint_rules import api_error_text, server_root
from kvlab.engines.servers.base import ScoringAPI, ScoringUnsupported

#: Why a server's fidelity cannot be measured, in the words a result shows.
NOT_MEASURED = "fidelity not measured by this endpoint"


def estimator(api: ScoringAPI | None = None) -> str:
    """What a server that answers measures, as an engine's description says it (``api``: its engine's own API)."""
    reads = api.reads if api is not None else "prompt_logprobs"
    return (f"sampled estimator: KL(baseline || config) from {reads} on a continuation the baseline sampled at "
            "temperature 1")


#: What a server that answers through its OpenAI completions measures.
SAMPLED_ESTIMATOR = estimator()

__all__ = ["NOT_MEASURED", "SAMPLED_ESTIMATOR", "Reference", "ScoringUnsupported", "ServerScorer",
           "continuation_scores", "estimator", "fidelity", "item_seed"]


@dataclass(frozen=True)
class Reference:
    """One item's reference from the baseline's server: the prompt's token ids, the continuation it sampled at
    temperature 1 with ``seed``, the baseline's log-probability of each continuation token and its top-1 token
    at each continuation position, and (kvlab serve) the prompt's context and question token counts."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    top1: tuple[int, ...]
    seed: int
    split: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the baseline's result keeps it (``extra["fidelity_reference"]``), so that another engine can score the
        same tokens later (the baselines' cross-engine KL)."""
        return {"prompt_ids": list(self.prompt_ids), "tokens": list(self.tokens), "logprobs": list(self.logprobs),
                "top1": list(self.top1), "seed": self.seed, "split": list(self.split) if self.split else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reference:
        split = data.get("split")
        return cls(tuple(int(t) for t in data["prompt_ids"]), tuple(int(t) for t in data["tokens"]),
                   tuple(float(v) for v in data["logprobs"]), tuple(int(t) for t in data["top1"]), int(data["seed"]),
                   (int(split[0]), int(split[1])) if split else None)


def item_seed(seed: int, item_id: str) -> int:
    """The sampling seed of one item: the run's seed and the item's id, the same on every machine."""
    return (seed * 1_000_003 + zlib.crc32(item_id.encode())) % (2**31 - 1)


def fidelity(reference: Reference, logprobs: Sequence[float], top1: Sequence[int]) -> Fidelity:
    """The sampled estimate of one config against the baseline on one item."""
    if len(logprobs) != len(reference.tokens) or len(top1) != len(reference.tokens):
        raise ScoringUnsupported(f"the server scored {len(logprobs)} of the continuation's {len(reference.tokens)} "
                                 "tokens")
    return Fidelity(kl=tuple(p - q for p, q in zip(reference.logprobs, logprobs, strict=True)),
                    agree=tuple(a == b for a, b in zip(reference.top1, top1, strict=True)),
                    teacher=TEACHER_BASELINE_SAMPLE)


def _field(obj: Any, name: str) -> Any:
    """A field of an ``openai`` response object that the SDK does not model (vLLM's and kvlab's own)."""
    value = getattr(obj, name, None)
    return value if value is not None else (getattr(obj, "model_extra", None) or {}).get(name)


def continuation_scores(prompt_logprobs: Any, prompt_length: int, tokens: Sequence[int]
                        ) -> tuple[list[float], list[int]]:
    """Each continuation token's log-probability and each position's top-1 token, from a ``prompt_logprobs``
    list (vLLM's shape: one entry per prompt token, None for the first, else ``{token id: {"logprob", "rank",
    ...}}`` holding the token given and the top ones)."""
    if not isinstance(prompt_logprobs, list) or len(prompt_logprobs) != prompt_length + len(tokens):
        raise ScoringUnsupported("its prompt_logprobs do not cover the prompt sent")
    logprobs, top1 = [], []
    for offset, token in enumerate(tokens):
        entry = prompt_logprobs[prompt_length + offset]
        if not isinstance(entry, Mapping) or str(token) not in entry:
            raise ScoringUnsupported(f"its prompt_logprobs lack the token at position {prompt_length + offset}")
        ranked = {int(key): value for key, value in entry.items()}
        logprobs.append(float(ranked[token]["logprob"]))
        top1.append(min(ranked, key=lambda key: (ranked[key].get("rank") or math.inf, -ranked[key]["logprob"])))
    return logprobs, top1


class ServerScorer:
    """Samples references and scores continuations on one OpenAI-compatible server.

    ``config_fields`` gives a request's kvlab fields for a config (``kvlab serve``'s ``kv_cache``; None for a
    server that holds one config); ``plain_sampling``: the fields that make the server's sampling plain
    temperature sampling (its serving engine's); ``api``: its serving engine's own API for the two requests, where
    its OpenAI completions cannot answer them (such a server holds one config: ``config_fields`` is not asked).
    :meth:`why_not` probes the server once (a short sampled request with token ids, then its scoring) and
    remembers the answer: None when the estimator works there, else the reason.
    """

    def __init__(self, client: openai.OpenAI, model_id: Callable[[], str],
                 config_fields: Callable[[TaskItem | None, KVCacheConfig, Reference | None], dict[str, Any] | None],
                 plain_sampling: Mapping[str, Any] | None = None, api: ScoringAPI | None = None):
        self.client = client
        self.plain_sampling = dict(plain_sampling or {})
        self.model_id = model_id
        self.config_fields = config_fields
        self.api = api
        self._verdict: tuple[str | None] | None = None
        self._lock = threading.Lock()

    @property
    def estimator(self) -> str:
        """What this server measures when it answers, in words."""
        return estimator(self.api)

    @property
    def probed(self) -> bool:
        return self._verdict is not None

    def why_not(self) -> str | None:
        """None when this server answers the estimator's requests, else why not (asked once, of the baseline)."""
        with self._lock:
            if self._verdict is None:
                self._verdict = (self._probe(),)
            return self._verdict[0]

    def _probe(self) -> str | None:
        probe = TaskItem(task="probe", item_id="kvlab-probe", context="The capital of France is Paris.",
                         question=" The capital of Italy is", answer="", context_length=0, depth=None, max_new_tokens=2)
        try:
            reference = self.reference(probe, BASELINE, seed=0)
        except ScoringUnsupported as error:
            return f"{NOT_MEASURED} ({error})"
        except (openai.BadRequestError, openai.UnprocessableEntityError, openai.NotFoundError) as error:
            asked = self.api.path if self.api is not None else "prompt_logprobs"
            return f"{NOT_MEASURED} (it refused a {asked} request: {api_error_text(error, 200)})"
        return None if reference.tokens else f"{NOT_MEASURED} (its sample held no token)"

    def reference(self, item: TaskItem, config: KVCacheConfig, seed: int) -> Reference:
        """Sample ``item``'s continuation on this (the baseline's) server and score it there (the baseline's own
        log-probabilities come from the same scoring request as every config's, so that like meets like)."""
        sampled = self._sample(item, config, seed)
        logprobs, top1 = self.score(sampled, config)
        return Reference(sampled.prompt_ids, sampled.tokens, tuple(logprobs), tuple(top1), seed, sampled.split)

    def _sample(self, item: TaskItem, config: KVCacheConfig, seed: int) -> Reference:
        """``item``'s prompt ids and a continuation sampled at temperature 1 with ``seed`` (not yet scored)."""
        if self.api is not None:
            answer = self._post(self.api.sample_body(item.context + item.question, item.max_new_tokens, seed))
            prompt_ids, tokens = self.api.sampled(answer)
            return Reference(tuple(prompt_ids), tuple(tokens), (), (), seed)
        response = self.client.completions.create(
            model=self.model_id(), prompt=item.context + item.question, max_tokens=item.max_new_tokens,
            temperature=1.0, top_p=1.0, seed=seed, extra_body=(self.config_fields(item, config, None) or {})
            | self.plain_sampling | {"return_token_ids": True})
        choice = response.choices[0]
        prompt_ids, tokens = _field(choice, "prompt_token_ids"), _field(choice, "token_ids")
        if not isinstance(prompt_ids, list) or not isinstance(tokens, list):
            raise ScoringUnsupported("it returns no token ids (return_token_ids)")
        split = _field(response, "kv_cache_prompt_split")
        return Reference(tuple(prompt_ids), tuple(tokens), (), (), seed,
                         tuple(split) if isinstance(split, list) and len(split) == 2 else None)

    def score(self, reference: Reference, config: KVCacheConfig, afresh: bool = False
              ) -> tuple[list[float], list[int]]:
        """Each continuation token's log-probability and each position's top-1 token under ``config``;
        ``afresh``: with a new ``cache_salt`` (vLLM's field), so that the server reuses no cached prefix and
        prefills the prompt and the continuation in one pass (:meth:`noise_floor`)."""
        if not reference.tokens:
            return [], []
        if self.api is not None:
            if afresh:
                raise ScoringUnsupported(f"its {self.api.path} scoring has no field that skips the prefix cache")
            answer = self._post(self.api.score_body(reference.prompt_ids, reference.tokens))
            return self.api.scored(answer, reference.prompt_ids, reference.tokens)
        salt = {"cache_salt": f"kvlab-floor-{uuid.uuid4().hex}"} if afresh else {}
        response = self.client.completions.create(
            model=self.model_id(), prompt=list(reference.prompt_ids + reference.tokens), max_tokens=1,
            temperature=0.0,
            extra_body=(self.config_fields(None, config, reference) or {}) | {"prompt_logprobs": 1} | salt)
        return continuation_scores(_field(response.choices[0], "prompt_logprobs"), len(reference.prompt_ids),
                                   reference.tokens)

    def noise_floor(self, reference: Reference) -> Fidelity:
        """The baseline against itself on this server: the reference's log-probabilities (scored right after its
        sample, its prompt cached) against the same tokens scored afresh (prompt and continuation prefilled in one
        pass).  The same estimator as every config's, so its mean over items is the engine's own noise floor
        under another batch shape and prefix reuse (``docs/concepts/measurement.md``)."""
        logprobs, top1 = self.score(reference, BASELINE, afresh=True)
        return fidelity(reference, logprobs, top1)

    def _post(self, body: dict[str, Any]) -> Any:
        """``body`` to the engine's own route, from the server's root; its parsed JSON answer."""
        assert self.api is not None
        return self.client.post(server_root(str(self.client.base_url)) + self.api.path, cast_to=object, body=body)
