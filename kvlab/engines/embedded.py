"""The embedded engine: a transformers model in this process, with kvlab's compressed cache.

For each item the prefill runs **once** per prompt layout (query-agnostic: the context;
query-aware: context and question) while every eviction scorer of the sweep records its
scores; then each config gets its own compressed copy of that cache and decodes from it.
The configs of a layout then decode **as one batch** (:mod:`kvlab.engines.batched_decode`): one
forward pass per step for all of them, each against its own compressed cache, split into smaller
batches when memory would run short.
Each config's TTFT is charged as if it ran alone: the prefill without any scorer, plus its own
scorer's measured time, its compression and its first step -- never another config's scorer.  A
batched step is charged to each member as if alone too: the step's shared part (projections, MLP,
head) at its cost for one member alone, plus the member's own cache and attention time.

The playground's modes and the prefill it keeps are :mod:`kvlab.engines.embedded_session`'s; ``kvlab serve``'s
requests, one at a time with their tokens streamed, are :mod:`kvlab.engines.embedded_streaming`'s.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any, cast

import psutil
import torch
from transformers import DynamicCache

from kvlab.compress.accounting import analytic_kv_bytes, check_fits
from kvlab.compress.cache import KVLabCache, build_compressed_cache
from kvlab.compress.decoding import DecodeCompressor
from kvlab.compress.eviction import (
    CollectedScores,
    Kept,
    attention_modules,
    collect_scores,
    gather_layer,
    kept_positions,
    replay_scores,
    scorer_key,
    select_tokens,
)
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.geometry import CacheGeometry
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import BASELINE, KVCacheConfig
from kvlab.core.results import (
    MEASURED_EMBEDDED,
    CacheLayout,
    GenerationKV,
    ItemResult,
    KeptPositions,
    KVMeasurement,
)
from kvlab.engines import attention
from kvlab.engines.base import Engine
from kvlab.engines.batched_decode import (
    MemberOutcome,
    Reference,
    available_bytes,
    batch_limit,
    decode_batch,
    member_bytes,
)
from kvlab.engines.embedded_session import HeldPrefill, SessionModes
from kvlab.models import LoadedModel, load_model
from kvlab.threads import torch_threads


def prompt_layouts(context: list[int], question: list[int]) -> dict[bool, tuple[list[int], list[int]]]:
    """``(prefix, suffix)`` by query-awareness: the prefix is prefilled and compressed, the suffix
    fed after.  Query-aware, all but the last question token are in the prefill (never evicted)."""
    return {False: (context, question), True: (context + question[:-1], question[-1:])}


def _scorers(configs: Sequence[KVCacheConfig]) -> set[Any]:
    """The eviction scorers a prefill records for these configs (their scores rank the tokens to evict)."""
    return {scorer_key(c) for c in configs}


@dataclass
class _ItemPlan:
    """How an item runs: each layout's prefix (prefilled), suffix (fed after compression) and targets (a
    perplexity item's continuation), keyed by whether it is the query-aware one, with the configs of each (the
    query-agnostic layout first)."""

    layouts: dict[bool, tuple[list[int], list[int], list[int] | None]]
    groups: dict[bool, list[KVCacheConfig]]
    prompt_tokens: int
    evictable: int  # the prompt positions eviction may drop

    def prefixes(self) -> dict[bool, list[int]]:
        return {aware: prefix for aware, (prefix, _, _) in self.layouts.items()}


@dataclass
class CompressedPrefill:
    """A prefill cache after one config's eviction and quantization, with its measured size
    (``kv.kept_tokens`` is the mean over full-attention layers; ``kv.peak_bytes`` is unknown until
    the answer is decoded: :meth:`measured`)."""

    cache: KVLabCache
    compress_s: float
    kv: KVMeasurement
    layout: CacheLayout
    kept: list[Kept]  # the prompt positions each layer kept (eviction.select_tokens)
    taken: KVMeasurement | None = None  # :meth:`measured` as it was at one point (a turn of a conversation)

    def measured(self) -> KVMeasurement:
        """The measurement with the cache's peak size so far and its size now."""
        if self.taken is not None:
            return self.taken
        return replace(self.kv, peak_bytes=self.cache.peak_bytes, final_bytes=self.cache.physical_bytes)


@dataclass
class _Prefill:
    """One prefill: the cache's keys and values per layer, every scorer's scores, and the time
    the prefill itself took (the scorers' own time taken out: it is charged to their configs)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    collected: CollectedScores
    prefill_s: float
    hidden: torch.Tensor | None = None  # the last layer's normed hidden states, ``[1, tokens, hidden]``, when asked

    def scores_for(self, config: KVCacheConfig) -> list[torch.Tensor | None]:
        key = scorer_key(config)
        return (self.collected.scores.get(key) if key is not None else None) or [None] * len(self.keys)

    def scorer_s(self, config: KVCacheConfig) -> float:
        key = scorer_key(config)
        return self.collected.seconds.get(key, 0.0) if key is not None else 0.0

    def cut(self, tokens: int) -> _Prefill:
        """The cache of the prefix's first ``tokens``, without scores: causal attention makes it what a prefill
        of those tokens alone computes, up to float rounding.  Its time is the whole prefill's."""
        return _Prefill([k[:, :, :tokens] for k in self.keys], [v[:, :, :tokens] for v in self.values],
                        CollectedScores({}, {}), self.prefill_s)


def fidelity_group(configs: Sequence[KVCacheConfig], measure: bool) -> tuple[list[KVCacheConfig], set[int]]:
    """The configs in decoding order, and the positions whose results are reported.  When fidelity is
    measured the baseline decodes first, as every other config's reference (added, and not reported,
    when the configs lack it)."""
    if not measure:
        return list(configs), set(range(len(configs)))
    baseline = next((c for c in configs if c.is_baseline), None)
    group = [baseline or BASELINE, *(c for c in configs if c is not baseline)]
    return group, set(range(len(group))) - ({0} if baseline is None else set())


class EmbeddedEngine(Engine):
    name = "embedded"

    def __init__(self, loaded: LoadedModel, seed: int = 0, max_batch: int | None = None, fidelity: bool = True):
        """``max_batch``: most configs decoded together (1: each alone); None: as many as memory allows.
        ``fidelity``: measure each config against the baseline (off only to measure what it costs:
        ``benchmarks/fidelity_cost.py``; the baseline then decodes only where the group holds it)."""
        self.loaded = loaded
        self.seed = seed
        self.max_batch = max_batch
        self.fidelity = fidelity
        self.modes = SessionModes()  # all off: an experiment's way; the playground's runs switch them on
        self._held_prefill: HeldPrefill[_Prefill] = HeldPrefill()
        self.model = loaded.model
        self.device = torch.device(loaded.device)
        attention.install(self.model)
        self.modules = attention_modules(self.model)
        self.geometry = CacheGeometry(
            num_layers=loaded.num_layers, num_kv_heads=loaded.num_kv_heads, head_dim=loaded.head_dim,
            layer_windows=tuple(loaded.sliding_window if sliding else None for sliding in loaded.layer_is_sliding),
        )
        self.max_context = loaded.max_context or 0  # positions the model takes (0: unknown)
        self._live_cache: DynamicCache | KVLabCache | list[KVLabCache] | None = None
        eos = self.model.generation_config.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.loaded.name, "model_path": str(self.loaded.path),
                "device": str(self.device), "dtype": self.loaded.dtype, "model_id": self.loaded.model_id}

    def close(self) -> None:
        """Nothing to release beyond the model, which the caller owns."""

    @contextmanager
    def session(self, modes: SessionModes) -> Iterator[None]:
        """The engine runs in ``modes`` (the playground's) within the block, and with all of them off again after
        it; the prefill it holds stays held for the next session (:attr:`SessionModes.reuse_prefill`)."""
        self.modes = modes
        try:
            yield
        finally:
            self.modes = SessionModes()

    def current_kv_bytes(self) -> int | None:
        """Bytes of the cache in use now (the prefill cache while prefilling); safe from another thread."""
        cache = self._live_cache
        if isinstance(cache, KVLabCache):
            return cache.physical_bytes
        if isinstance(cache, list):  # a batch: every member's cache
            return sum(member.physical_bytes for member in cache)
        if cache is not None:
            return sum(t.numel() * t.element_size() for layer in list(cache.layers)
                       for t in (layer.keys, layer.values) if t is not None)
        return None

    def check_configs(self, configs: Sequence[KVCacheConfig]) -> None:
        if any(self.geometry.sliding_layers) and any(c.evict != "none" for c in configs):
            raise ConfigError(
                f"{self.loaded.name} has sliding-window layers; kvpress eviction presses do not support its "
                "text-only model class (wrong output in our checks). Use quantization only (evict = 'none') "
                "on this model, or a model without sliding windows such as smollm2-135m"
            )
        for config in configs:
            problem = check_fits(config, self.geometry)
            if problem:
                raise ConfigError(f"{config.label}: {problem}")

    def check_items(self, items: Sequence[TaskItem]) -> None:
        """Every task kind runs here, within the model's context (``kvlab serve`` refuses the same)."""
        limit = self.max_context
        conversations: dict[str, int] = {}  # a multi-turn context: every question and answer so far
        for item in items:
            if item.multi_turn and item.context_id is not None:
                conversations[item.context_id] = (conversations.get(item.context_id) or len(
                    self._encode(item.context, special=True))) + self._tokens_needed(item, with_context=False)
        too_long = [(item, needed) for item in items if limit and (needed := (
            conversations[item.context_id] if item.multi_turn and item.context_id is not None
            else self._tokens_needed(item))) > limit]
        if too_long:
            item, needed = too_long[0]
            more = f" (and {len(too_long) - 1} more items)" if len(too_long) > 1 else ""
            raise ConfigError(
                f"item {item.item_id}: {needed} tokens (prompt and new tokens) exceed {self.loaded.name}'s maximum "
                f"context of {limit} tokens (max_position_embeddings){more}; shorten the prompt or use a model "
                "with a longer context"
            )

    def _tokens_needed(self, item: TaskItem, with_context: bool = True) -> int:
        """Positions :meth:`evaluate` uses: the prompt as it encodes it, plus the tokens it may generate."""
        context = len(self._encode(item.context, special=True)) if with_context else 0
        if item.kind == "perplexity":
            return context + len(self._encode(item.continuation, special=False))
        return context + len(self._encode(item.question, special=False)) + item.max_new_tokens

    def evaluate_many(self, work: Iterable[tuple[TaskItem, Sequence[KVCacheConfig]]]
                      ) -> Generator[tuple[TaskItem, ItemResult], None, None]:
        """Items one after the other, except those that share a context (``context_id``): each such
        context is prefilled and compressed once and all its questions answered from that cache
        (:meth:`evaluate_shared`), when its first question comes up."""
        work = list(work)
        shared: dict[str, list[tuple[TaskItem, Sequence[KVCacheConfig]]]] = {}
        for item, configs in work:
            if item.context_id is not None:
                shared.setdefault(item.context_id, []).append((item, configs))
        for item, configs in work:
            if item.context_id is None:
                yield from ((item, result) for result in self.evaluate(item, configs))
            elif (group := shared.pop(item.context_id, None)) is not None:
                yield from self.evaluate_shared(group)

    # -- one item ---------------------------------------------------------------------------

    def _encode(self, text: str, special: bool) -> list[int]:
        return self.tokenizer(text, add_special_tokens=special)["input_ids"]

    def _plan(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> _ItemPlan:
        """How :meth:`evaluate` runs the item: its layouts (prefix, suffix, targets) and the configs of each."""
        context = self._encode(item.context, special=True)
        if item.kind == "perplexity":
            continuation = self._encode(item.continuation, special=False)
            # The last context token is fed after compression, so every continuation token is
            # predicted from the compressed cache.
            # No question here: query-aware configs share the query-agnostic layout.
            layouts: dict[bool, tuple[list[int], list[int], list[int] | None]] = {
                False: (context[:-1], context[-1:] + continuation[:-1], continuation)}
            prompt_tokens = len(context) + len(continuation)
        else:
            question = self._encode(item.question, special=False)
            layouts = {aware: (prefix, suffix, None)
                       for aware, (prefix, suffix) in prompt_layouts(context, question).items()}
            prompt_tokens = len(context) + len(question)

        def layout_of(config: KVCacheConfig) -> bool:
            return config.query_aware and config.query_aware in layouts

        groups = {aware: list(group) for aware, group in groupby(sorted(configs, key=layout_of), key=layout_of)}
        return _ItemPlan(layouts, groups, prompt_tokens, len(context) - (1 if item.kind == "perplexity" else 0))

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]:
        plan = self._plan(item, configs)
        shared = self._shared_prefills(plan.groups, plan.prefixes())
        reference: Reference | None = None
        for query_aware, group in plan.groups.items():  # the query-agnostic layout first
            prefix, suffix, targets = plan.layouts[query_aware]
            reference = yield from self._evaluate_layout(item, group, prefix, suffix, targets, plan.evictable,
                                                         plan.prompt_tokens, shared.get(query_aware),
                                                         reference if shared else None)

    @torch.no_grad()
    def prefill_ahead(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> None:
        """The prefill :meth:`evaluate` starts with for this item and these configs, computed now and kept for it
        (:attr:`SessionModes.reuse_prefill`, which must be on): the playground prefills the item a page shows
        before its Run is asked for, so that the Run finds it done."""
        assert self.modes.reuse_prefill, "a prefill ahead is kept only where reuse_prefill is on"
        plan = self._plan(item, configs)
        if not self._shared_prefills(plan.groups, plan.prefixes()):
            first, group = next(iter(plan.groups.items()))  # the layout evaluate() runs first
            self.current_config = None
            self._prefill(plan.layouts[first][0], _scorers(group))
        self.phase, self._live_cache = "idle", None

    @torch.no_grad()
    def _shared_prefills(self, groups: dict[bool, list[KVCacheConfig]], prefixes: dict[bool, list[int]]
                         ) -> dict[bool, _Prefill]:
        """Both layouts' prefills from one of the query-aware prefix (:attr:`SessionModes.share_prefill`), where the
        query-agnostic configs need no prefill scores and no layer slides (a sliding layer's cache holds its
        window only, so it cannot be cut back to the context); ``{}`` otherwise: each layout prefills its own."""
        if not (self.modes.share_prefill and set(groups) == {False, True} and not any(self.geometry.sliding_layers)
                and all(scorer_key(config) is None for config in groups[False])):
            return {}
        self.current_config = None
        aware = self._prefill(prefixes[True], _scorers(groups[True]))
        return {True: aware, False: aware.cut(len(prefixes[False]))}

    @torch.no_grad()
    def _evaluate_layout(self, item: TaskItem, configs: list[KVCacheConfig], prefix: list[int], suffix: list[int],
                         targets: list[int] | None, evictable: int, prompt_tokens: int,
                         prefill: _Prefill | None = None, earlier: Reference | None = None
                         ) -> Generator[ItemResult, None, Reference | None]:
        """The layout's configs on one item, in batches, each config measured against the baseline (from
        ``prefill`` when given, else a prefill of ``prefix``; ``earlier``: the baseline's run in the other
        layout, which the configs are measured against instead).  Returns the baseline's run (None where
        fidelity is not measured)."""
        self.current_config = None
        prefill = prefill or self._prefill(prefix, _scorers(configs))
        # The baseline is every other config's reference: it decodes in the first batch (added, and
        # not reported, when the group lacks it); later batches get its finished run.  In the
        # query-aware layout the added baseline has the question in its prefill (float32 there, 16-bit
        # when fed): the same model and tokens as the reported baseline, rounded a little differently.
        # Where the layouts share a prefill (the playground), the query-aware configs are measured against
        # the query-agnostic baseline's run instead (``earlier``): one member less to decode.
        measure = self.fidelity and any(not c.is_baseline for c in configs)
        if measure and earlier is not None and not any(c.is_baseline for c in configs):
            group, reported = list(configs), set(range(len(configs)))
        else:
            group, reported, earlier = *fidelity_group(configs, measure), None
        fed = len(suffix) if targets is not None else 1
        per_member = member_bytes(self.geometry, len(prefix) + len(suffix) + item.max_new_tokens, fed,
                                  self.model.config.vocab_size, self.model.dtype.itemsize)
        # a member that leaves the baseline's tokens keeps a copy of its cache: plan for two per member;
        # the reference's log-probabilities are kept for every token it predicts (twice while stacked)
        predicted = len(targets) if targets is not None else item.max_new_tokens
        reference_bytes = 2 * predicted * self.model.config.vocab_size * 4 if measure else 0
        limit = self.max_batch or batch_limit(2 * per_member if measure else per_member,
                                              max(available_bytes(self.device) - reference_bytes, 0))
        reference: Reference | int | None = (0 if earlier is None else earlier) if measure else None
        for start in range(0, len(group), limit):
            batch = group[start:start + limit]
            decoded = self._decode(item, batch, prefill, prefix, suffix, targets, evictable, reference)
            for index, (config, (compressed, outcome)) in enumerate(zip(batch, decoded, strict=True), start):
                if index in reported:
                    yield self._result(item, config, prefill, compressed, outcome, targets, prompt_tokens)
            if start == 0 and reference == 0:
                reference = decoded[0][1].reference
        self.phase, self.current_config, self._live_cache = "idle", None, None
        return reference if isinstance(reference, Reference) else None

    # -- one context, several questions -----------------------------------------------------------

    @torch.no_grad()
    def evaluate_shared(self, work: Sequence[tuple[TaskItem, Sequence[KVCacheConfig]]]
                        ) -> Iterator[tuple[TaskItem, ItemResult]]:
        """Questions of one context: the context is prefilled once and compressed once per config,
        before any question is seen (query-agnostic), then each question is answered from that cache.
        Independent questions each start from a copy of the compressed context (the configs decoded
        as one batch, measured against the baseline); ``multi_turn`` ones follow the previous answer
        in one conversation, each config alone (its history is its own, so no fidelity).  The prefill
        and each config's scorer and compression are charged to the first question
        (``extra["shared_context"]``)."""
        items = sorted((item for item, _ in work), key=lambda item: item.question_rank)
        pending = {item.item_id: {c.label for c in configs} for item, configs in work}
        configs = list({c.label: c for _, cs in work for c in cs}.values())
        if any(c.query_aware for c in configs):
            raise ConfigError(f"context {items[0].context_id}: query-aware configs cannot share a context "
                              "compressed before its questions")
        context = self._encode(items[0].context, special=True)
        questions = [self._encode(item.question, special=False) for item in items]
        self.current_config = None
        prefill = self._prefill(context, _scorers(configs))
        multi_turn = items[0].multi_turn
        measure = self.fidelity and not multi_turn and any(not c.is_baseline for c in configs)
        group, reported = fidelity_group(configs, measure)
        answers = [len(q) + i.max_new_tokens for q, i in zip(questions, items, strict=True)]
        longest = len(context) + (sum(answers) if multi_turn else max(answers))
        per_member = member_bytes(self.geometry, longest, 1, self.model.config.vocab_size, self.model.dtype.itemsize)
        # each member holds its compressed context and, while a question is decoded, a copy of it
        limit = self.max_batch or batch_limit(3 * per_member, available_bytes(self.device))
        references: dict[int, Reference] = {}
        for start in range(0, len(group), limit):
            batch = group[start:start + limit]
            compressed = []
            for config in batch:
                self.current_config = config.label
                compressed.append(self._compress(config, prefill.scores_for(config), prefill.keys, prefill.values,
                                                 len(context), len(context)))
            decoded = (self._conversation(items, questions, batch, compressed, len(context)) if multi_turn
                       else self._questions(items, questions, batch, compressed, len(context), references,
                                            first=start == 0 and measure))
            for rank, item in enumerate(items):
                for index, (config, (kv, outcome)) in enumerate(zip(batch, decoded[rank], strict=True), start):
                    if index not in reported or config.label not in pending[item.item_id]:
                        continue
                    result = self._result(item, config, prefill, kv, outcome, None,
                                          len(context) + len(questions[rank]), charged=rank == 0)
                    result.extra["shared_context"] = {
                        "context_id": item.context_id, "rank": item.question_rank, "questions": len(items),
                        "multi_turn": multi_turn, "prefill_charged": rank == 0}
                    yield item, result
        self.phase, self.current_config, self._live_cache = "idle", None, None

    def _questions(self, items: Sequence[TaskItem], questions: list[list[int]], batch: list[KVCacheConfig],
                   compressed: list[CompressedPrefill], position: int, references: dict[int, Reference],
                   first: bool) -> list[list[tuple[CompressedPrefill, MemberOutcome]]]:
        """Each question from its own copy of every config's compressed context, the batch decoding it
        together (``first``: the batch holds the baseline, every later batch's reference)."""
        decoded = []
        for rank, (item, question) in enumerate(zip(items, questions, strict=True)):
            copies = [replace(c, cache=copy.deepcopy(c.cache)) for c in compressed]
            caches = [c.cache for c in copies]
            self.phase, self._live_cache = "decode", caches
            reference: Reference | int | None = 0 if first else references.get(rank)
            outcomes = decode_batch(self.model, caches, question, position, None, item.max_new_tokens, item.stop,
                                    self.stop_ids, self.tokenizer.decode, reference=reference,
                                    compressor=self._compressor(batch, caches))
            if first:
                baseline_run = outcomes[0].reference
                assert baseline_run is not None  # member 0, the reference member, keeps its run (reference=0)
                references[rank] = baseline_run
            decoded.append(list(zip(copies, outcomes, strict=True)))
        return decoded

    def _conversation(self, items: Sequence[TaskItem], questions: list[list[int]], batch: list[KVCacheConfig],
                      compressed: list[CompressedPrefill], position: int
                      ) -> list[list[tuple[CompressedPrefill, MemberOutcome]]]:
        """The questions as one conversation per config, each after that config's own previous answer
        (its last token, unless an end token, is fed with the next question)."""
        decoded: list[list[tuple[CompressedPrefill, MemberOutcome]]] = [[] for _ in items]
        for config, held in zip(batch, compressed, strict=True):
            self.current_config, self._live_cache, self.phase = config.label, held.cache, "decode"
            compressor = self._compressor([config], [held.cache])
            at = position
            carried: list[int] = []
            for rank, (item, question) in enumerate(zip(items, questions, strict=True)):
                suffix = carried + question
                outcome = decode_batch(self.model, [held.cache], suffix, at, None, item.max_new_tokens, item.stop,
                                       self.stop_ids, self.tokenizer.decode, compressor=compressor)[0]
                at += len(suffix) + len(outcome.generated) - 1  # the last generated token is not in the cache yet
                carried = [] if outcome.generated[-1] in self.stop_ids else outcome.generated[-1:]
                decoded[rank].append((replace(held, taken=held.measured()), outcome))  # the cache after this turn
        return decoded

    def _prefill(self, prefix: list[int], scorers: set[Any], hidden: bool = False) -> _Prefill:
        """The prefix's prefill (:meth:`_run_prefill`), the held one again where
        :attr:`SessionModes.reuse_prefill` allows."""
        return self._held_prefill.get((tuple(prefix), frozenset(scorers), hidden),
                                      lambda: self._run_prefill(prefix, scorers, hidden),
                                      reuse=self.modes.reuse_prefill)

    def _run_prefill(self, prefix: list[int], scorers: set[Any], hidden: bool = False) -> _Prefill:
        """Run the prefix once while every eviction scorer in ``scorers`` records its scores (``hidden``: and
        keep the last hidden states, for the prefix's own log-probabilities).  An empty prefix (a one-token
        served prompt) gives empty caches."""
        cache = DynamicCache(config=self.model.config)
        self.phase, self._live_cache = "prefill", cache
        start = time.perf_counter()
        if not prefix:
            empty = torch.zeros(1, self.geometry.num_kv_heads, 0, self.geometry.head_dim, device=self.device)
            layers = [empty] * self.geometry.num_layers
            return _Prefill(layers, layers, CollectedScores({}, {}), 0.0)
        with replay_scores(self.model, scorers - {None}) as replayed:  # KVzip: after the prefill, its replay
            with collect_scores(self.model, scorers - {None}, self.seed, self.geometry.sliding_layers) as collected:
                out = self.model.model(input_ids=torch.tensor([prefix], device=self.device), past_key_values=cache,
                                       use_cache=True)
        elapsed = time.perf_counter() - start
        collected.scores |= replayed.scores
        collected.seconds |= replayed.seconds
        # every layer ran, so every layer's keys and values are set (transformers types them as optional)
        keys = cast(list[torch.Tensor], [layer.keys for layer in cache.layers])
        values = cast(list[torch.Tensor], [layer.values for layer in cache.layers])
        return _Prefill(keys, values, collected, max(elapsed - sum(collected.seconds.values()), 0.0),
                        out.last_hidden_state if hidden else None)

    def _compress(self, config: KVCacheConfig, layer_scores: list[torch.Tensor | None],
                  layer_keys: list[torch.Tensor], layer_values: list[torch.Tensor], prefix_len: int,
                  evictable: int) -> CompressedPrefill:
        """Evict and quantize the prefill cache for one config (the prefill tensors are left as they are)."""
        self.phase = "compress"
        start = time.perf_counter()
        kept = select_tokens(config, layer_scores, layer_keys, layer_values, self.modules, evictable,
                             self.geometry.sliding_layers)
        layer_kv = [gather_layer(k, v, idx)
                    for k, v, idx in zip(layer_keys, layer_values, kept, strict=True)]
        cache = build_compressed_cache(config, layer_kv, self.geometry.layer_windows, seen_tokens=prefix_len)
        del layer_kv
        compress_s = time.perf_counter() - start
        kept_per_head = cache.kept_per_head()
        full_layers = [sum(heads) / len(heads) for heads, sliding
                       in zip(kept_per_head, self.geometry.sliding_layers, strict=True) if not sliding]
        kept_mean = sum(full_layers) / len(full_layers)
        protected = prefix_len - evictable
        layout = CacheLayout(tuple(kept_per_head), tuple(layer.physical_bytes for layer in cache.kv_layers))
        return CompressedPrefill(cache=cache, compress_s=compress_s, layout=layout, kept=kept, kv=KVMeasurement(
            context_tokens=prefix_len, kept_tokens=kept_mean,
            kept_fraction=(kept_mean - protected) / evictable if evictable else 1.0,
            baseline_bytes=self.geometry.baseline_bytes(prefix_len), physical_bytes=cache.physical_bytes,
            analytic_bytes=analytic_kv_bytes(config, self.geometry, kept_per_head), source=MEASURED_EMBEDDED,
        ))

    def _decode(self, item: TaskItem, configs: list[KVCacheConfig], prefill: _Prefill, prefix: list[int],
                suffix: list[int], targets: list[int] | None, evictable: int,
                reference: Reference | int | None = None) -> list[tuple[CompressedPrefill, MemberOutcome]]:
        """The configs decoded together, each from its own compressed cache (peak memory: the batch's);
        a single config runs alone."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        with torch_threads(self.modes.decode_threads):  # compressing too: many small kernels
            compressed = []
            for config in configs:
                self.current_config = config.label
                compressed.append(self._compress(config, prefill.scores_for(config), prefill.keys, prefill.values,
                                                 len(prefix), evictable))
            caches = [c.cache for c in compressed]
            # no single trial owns a batched step: telemetry samples it as the batch's, with all its caches
            self.phase = "decode"
            self.current_config, self._live_cache = ((configs[0].label, caches[0]) if len(configs) == 1
                                                     else (None, caches))
            outcomes = decode_batch(self.model, caches, suffix, len(prefix), targets, item.max_new_tokens, item.stop,
                                    self.stop_ids, self.tokenizer.decode, reference=reference,
                                    compressor=self._compressor(configs, caches))
        return list(zip(compressed, outcomes, strict=True))

    def _compressor(self, configs: Sequence[KVCacheConfig], caches: Sequence[KVLabCache]) -> DecodeCompressor | None:
        """The decode-time policies of those configs that have one, tracking their caches (None: no policy)."""
        if all(config.decode is None for config in configs):
            return None
        compressor = DecodeCompressor(self.model, self.modules, self.geometry.sliding_layers, self.seed)
        for config, cache in zip(configs, caches, strict=True):
            compressor.track(cache, config)
        return compressor

    def _result(self, item: TaskItem, config: KVCacheConfig, prefill: _Prefill, compressed: CompressedPrefill,
                outcome: MemberOutcome, targets: list[int] | None, prompt_tokens: int,
                charged: bool = True) -> ItemResult:
        """``charged``: the prefill, the scorer and the compression are this item's (not a later question's
        of a shared context: they were charged to its first)."""
        prefill_s, scorer_s = (prefill.prefill_s, prefill.scorer_s(config)) if charged else (0.0, 0.0)
        compress_s = compressed.compress_s if charged else 0.0
        generated_ids = outcome.generated
        kv_fields = compressed.measured().result_fields()
        if outcome.fidelity is not None:
            kv_fields["extra"] = {**kv_fields["extra"], "fidelity": outcome.fidelity.to_dict()}
        kv_fields["extra"]["cache_layout"] = compressed.layout.to_dict()
        if self.modes.report_positions:
            kv_fields["extra"]["kept_positions"] = self.kept_positions(compressed).to_dict()
        if targets is None:
            kv_fields["extra"]["generation_kv"] = GenerationKV.from_trace(
                outcome.kv_trace, self.geometry.baseline_bytes(outcome.kv_trace[-1][0])).to_dict()
        return ItemResult(
            item_id=item.item_id, task=item.task, config_name=config.label,
            config=config.model_dump(mode="json"), seed=self.seed, context_length=item.context_length,
            depth=item.depth, prompt_tokens=prompt_tokens, **kv_fields,
            generated=self.tokenizer.decode(generated_ids, skip_special_tokens=True), answer=item.answer,
            output_tokens=len(generated_ids),
            ttft_s=prefill_s + scorer_s + compress_s + outcome.first_s,
            tpot_s=outcome.decode_s / (len(generated_ids) - 1) if len(generated_ids) > 1 else None,
            prefill_s=prefill_s, compress_s=compress_s, decode_s=outcome.decode_s, score_s=scorer_s,
            first_token_s=outcome.first_s,
            peak_memory_bytes=self._peak_memory(), nll=outcome.nll,
            nll_tokens=len(targets) if targets is not None else None,
        )

    def kept_positions(self, compressed: CompressedPrefill) -> KeptPositions:
        """The prompt positions each KV head of each layer of ``compressed`` holds."""
        return kept_positions(compressed.kept, compressed.kv.context_tokens, self.geometry.layer_windows,
                              self.geometry.num_kv_heads)

    def _peak_memory(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return psutil.Process().memory_info().rss


def build(spec: ExperimentSpec) -> EmbeddedEngine:
    """Load the spec's model in this process (the backend registry's ``embedded`` entry)."""
    backend = spec.backend
    device = None if backend.device == "auto" else backend.device
    dtype = None if backend.dtype == "auto" else backend.dtype
    return EmbeddedEngine(load_model(spec.model, device=device, dtype=dtype), seed=spec.seed)
