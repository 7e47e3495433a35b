"""Token eviction: kvpress scorers run once during the shared prefill, budgets applied per config.

kvpress presses score and drop tokens inside a forward hook, one press per prefill.  kvlab
sweeps many budgets over the same prefill, so it calls each press's own ``score`` in a hook
(exactly the arguments kvpress passes), keeps the scores, and applies each config's budget
afterwards: ``ratio``/``keep_fraction`` keep the top tokens per head (kvpress's
``ScorerPress.compress``), ``keep_tokens`` a count of them, ``threshold`` keeps tokens above a
global score quantile.  A head-wise budget (AdaKV, CriticalAdaKV) runs kvpress's own head-wise
press on the kept scores and reads the entries it would mask: each head keeps the others.  KVzip
scores after the prefill, by kvpress's own replay of the context (:func:`replay_scores`), and shares
one budget out across all layers and heads as kvpress's ``compress_post`` does.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast, overload

import torch
from kvpress import DecodingPress, KVzipPress, ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn

from kvlab.core.errors import ConfigError
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import HEAD_BUDGETS, METHODS, UNIFORM_HEADS, Method
from kvlab.core.results import KeptPositions

if TYPE_CHECKING:
    from kvlab.compress.cache import LayerKV

#: Per layer, the kept token indices: ``[B, kv_heads, k]`` (every head keeps k), one ``[1, 1, k_h]``
#: per head (a head-wise budget), or None (everything kept).
Kept = torch.Tensor | tuple[torch.Tensor, ...] | None

#: Methods that need the full attention matrix of the prefill (computed eagerly).
NEEDS_ATTENTION_WEIGHTS = frozenset(name for name, m in METHODS.items() if m.needs_attention_weights)


def press_class(method: Method) -> type[ScorerPress]:
    """The kvpress press class a registry entry names."""
    return _kvpress_class(method.press)


def _kvpress_class(name: str) -> type:
    return getattr(importlib.import_module("kvpress"), name)


@dataclass(frozen=True)
class ScorerKey:
    """What determines a scorer's scores: configs sharing a key share scores.  ``params`` are the
    method's own parameters (and ``removed``, the budget, for budget-dependent presses)."""

    method: str
    params: tuple[tuple[str, Any], ...] = ()


def scorer_key(config: KVCacheConfig) -> ScorerKey | None:
    """The prefill scorer a config needs; None for no eviction of the prompt (none, or a method that
    compresses during generation only) and for positional methods."""
    if not config.budgets_given or (name := METHODS[config.evict].scorer_method) is None:
        return None
    method = METHODS[name]
    params = tuple((field, getattr(config, field)) for field in method.params)
    if method.budget_dependent:
        params += (("removed", config.removed_fraction),)
    return ScorerKey(name, params)


def make_press(method: Method, params: dict[str, Any], seed: int) -> ScorerPress:
    """The press of ``method`` with kvlab's ``params`` (config field names, and ``removed``)."""
    kwargs: dict[str, Any] = {method.params[k]: v for k, v in params.items() if k in method.params}
    if "removed" in params:
        kwargs["compression_ratio"] = params["removed"]
    if method.seeded:
        kwargs["seed"] = seed
    if method.wraps is not None:
        return press_class(method)(press=make_press(METHODS[method.wraps], params, seed))
    return press_class(method)(**kwargs)


def make_scorer(key: ScorerKey, seed: int) -> ScorerPress:
    return make_press(METHODS[key.method], dict(key.params), seed)


def _config_press(config: KVCacheConfig, removed: float) -> ScorerPress:
    """The press of ``config``'s own method with its parameters and budget (positional scoring,
    per-layer budgets)."""
    method = METHODS[config.evict]
    return make_press(method, {f: getattr(config, f) for f in method.params} | {"removed": removed}, seed=0)


class AttentionModule(nn.Module):
    """A decoder layer's attention module (transformers' own class, never this one) as kvlab reads it: the plain
    attributes that transformers, kvpress and kvlab set on it, which ``nn.Module.__getattr__`` (typed as
    returning a tensor or a module) would hide from the type checker."""

    layer_idx: int
    kvlab_return_weights: bool  # kvlab.engines.attention: also return the attention summed over queries
    kvlab_weights_s: float  # the seconds that sum took
    masked_key_indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # set by kvpress's presses


def _decoder(model: nn.Module) -> nn.Module:
    # submodules (nn.Module.__getattr__ is typed as returning a tensor or a module)
    return cast(nn.Module, model.model.language_model if hasattr(model.model, "language_model") else model.model)


def attention_modules(model: nn.Module) -> list[AttentionModule]:
    layers = cast(nn.ModuleList, _decoder(model).layers)
    return [cast(AttentionModule, layer.self_attn) for layer in layers]


def share_rotary_embedding(model: nn.Module) -> None:
    """Give each attention module the model's rotary embedding, which some scorers read
    (ExpectedAttention), as kvpress's press context does."""
    for module in attention_modules(model):
        module.rotary_emb = _decoder(model).rotary_emb


@dataclass
class CollectedScores:
    """Every scorer's per-layer scores ``[B, kv_heads, T]`` and the seconds each one cost."""

    scores: dict[ScorerKey, list[torch.Tensor | None]]
    seconds: dict[ScorerKey, float]


@contextmanager
def collect_scores(model: nn.Module, keys: set[ScorerKey], seed: int,
                   skip_layers: tuple[bool, ...]) -> Iterator[CollectedScores]:
    """During one prefill, compute every scorer's per-layer scores ``[B, kv_heads, T]``.

    Hooks run after each attention layer, when the cache holds that layer's keys and values,
    and call each press's ``score`` as kvpress's own hook would.  Layers in ``skip_layers``
    (sliding window) are not scored: they are never evicted.  Each scorer's own time is
    measured apart (H2O's includes the attention sums it needs), so a sweep charges every
    config its own scorer and nobody else's.
    """
    modules = attention_modules(model)
    keys = {k for k in keys if not METHODS[k.method].replays_context}  # scored after the prefill (replay_scores)
    collected = CollectedScores({k: [None] * len(modules) for k in keys}, {k: 0.0 for k in keys})
    scores = collected.scores
    scorers = {k: make_scorer(k, seed) for k in keys}
    for scorer in scorers.values():
        scorer.post_init_from_model(model)
    want_weights = any(k.method in NEEDS_ATTENTION_WEIGHTS for k in keys)
    global_rng = {k for k in keys if METHODS[k.method].global_rng}

    def hook(module: AttentionModule, args: tuple, kwargs: dict, output: tuple) -> None:
        layer = module.layer_idx
        cache = kwargs["past_key_values"].layers[layer]
        for key, scorer in scorers.items():
            # output[1] is the attention summed over queries (kvlab.engines.attention), which only
            # H2O reads; SnapKV and TOVA compute their window attention themselves when given None.
            attentions = output[1] if key.method in NEEDS_ATTENTION_WEIGHTS else None
            start = time.perf_counter()
            # presses that sketch with torch's global RNG are seeded per layer: reproducible scores
            rng = torch.random.fork_rng(devices=[]) if key in global_rng else nullcontext()
            with torch.no_grad(), rng:
                if key in global_rng:
                    torch.manual_seed(seed + layer)
                scores[key][layer] = scorer.score(module, kwargs["hidden_states"], cache.keys, cache.values,
                                                  attentions, kwargs).float()
            collected.seconds[key] += time.perf_counter() - start
            if attentions is not None:
                collected.seconds[key] += module.kvlab_weights_s
        module.kvlab_weights_s = 0.0

    handles = []
    share_rotary_embedding(model)
    try:
        for module, skip in zip(modules, skip_layers, strict=True):
            if skip or not keys:
                continue
            module.kvlab_return_weights = want_weights
            module.kvlab_weights_s = 0.0
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        yield collected
    finally:
        for handle in handles:
            handle.remove()
        for module in modules:
            module.kvlab_return_weights = False


# kvpress warns on every KVzipPress that its replay costs 2-3 prefills: kvlab measures that cost and charges it
# to KVzip's configs (their scorer seconds, in TTFT), so the warning would only repeat itself on every item.
logging.getLogger("kvpress.presses.kvzip_press").setLevel(logging.ERROR)


class _KVzipScorer(KVzipPress):
    """kvpress's KVzip, its replay of the context as it is, keeping the scores instead of masking: kvlab
    applies each budget to them afterwards (:func:`_replayed_tokens`)."""

    def compress_post(self, model: nn.Module) -> None:
        self.kept_scores = self.score_val.clone()


@contextmanager
def replay_scores(model: nn.Module, keys: set[ScorerKey]) -> Iterator[CollectedScores]:
    """Around a prefill (one forward of ``model.model`` with a ``DynamicCache``): afterwards, a KVzip scorer
    has the model repeat the context over that cache (kvpress's own passes, the cache cut back to the
    context after each layer) and keeps each layer's scores ``[1, kv_heads, T]``, with the seconds the
    replay took (charged to KVzip alone)."""
    keys = {k for k in keys if METHODS[k.method].replays_context}
    collected = CollectedScores({}, {})
    if len(keys) > 1:  # kvpress's replay wraps the model's forward: a second one would capture the first's replay
        raise ConfigError(f"{len(keys)} KVzip scorers in one run ({', '.join(str(dict(k.params)) for k in keys)}): "
                          f"give KVzip configs of one experiment the same n_sink")
    with ExitStack() as stack:
        for key in keys:
            scorer = _KVzipScorer(compression_ratio=_REPLAY_RATIO, **_kvpress_params(key))
            stack.callback(_record_replay, collected, key, scorer)  # after its replay
            stack.enter_context(scorer(model))  # kvpress replays on its way out of this context
            stack.callback(_start_replay, collected, key)  # before its replay (the stack unwinds in reverse)
        yield collected


_REPLAY_RATIO = 0.5  # any ratio above 0 makes kvpress replay; the budgets are kvlab's, applied afterwards


def _kvpress_params(key: ScorerKey) -> dict[str, Any]:
    method = METHODS[key.method]
    return {method.params[k]: v for k, v in key.params if k in method.params}


def _start_replay(collected: CollectedScores, key: ScorerKey) -> None:
    collected.seconds[key] = -time.perf_counter()


def _record_replay(collected: CollectedScores, key: ScorerKey, scorer: _KVzipScorer) -> None:
    collected.seconds[key] += time.perf_counter()
    scores = getattr(scorer, "kept_scores", None)
    collected.scores[key] = [] if scores is None else [layer.float() for layer in scores]


def _replayed_tokens(config: KVCacheConfig, layer_scores: list[torch.Tensor], modules: list[AttentionModule],
                     removed: float) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's per-head kept indices under one budget shared across every layer and head: kvpress's own
    ``KVzipPress.compress_post`` on the replay's scores, read from the entries it would mask."""
    press = KVzipPress(compression_ratio=removed, n_sink=config.n_sink)
    press.score_val = torch.stack(layer_scores)
    layers = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(self_attn=m) for m in modules]))
    heads, tokens = layer_scores[0].shape[-2:]
    device = layer_scores[0].device
    kept = []
    try:
        KVzipPress.compress_post(press, layers)
        for module in modules:
            keep = torch.ones(heads, tokens, dtype=torch.bool, device=device)
            assert module.masked_key_indices is not None  # compress_post sets them on every layer
            _, head_index, token_index = module.masked_key_indices  # kvpress keeps them on the CPU
            keep[head_index.to(device), token_index.to(device)] = False
            kept.append(tuple(row.nonzero().flatten().view(1, 1, -1) for row in keep))
    finally:
        for module in modules:
            module.masked_key_indices = None
    return kept


def ratio_keeping(length: int, count: int) -> float:
    """The compression ratio that keeps exactly ``count`` of ``length`` tokens through kvpress's rounding:
    kvpress's own search (``DecodingPress._find_target_compression_ratio``, which never reads its instance)."""
    return DecodingPress._find_target_compression_ratio(None, length, count)


def _protect(scores: torch.Tensor, evictable: int) -> torch.Tensor:
    """Scores with positions from ``evictable`` on (the question, in query-aware mode) always kept."""
    if evictable >= scores.shape[-1]:
        return scores
    scores = scores.clone()
    scores[..., evictable:] = float("inf")
    return scores


def _top_indices(scores: torch.Tensor, n_kept: int) -> torch.Tensor:
    """Indices of the ``n_kept`` best tokens per head, in position order (recency stays meaningful)."""
    return scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values


def _standardized(scores: torch.Tensor, evictable: int) -> torch.Tensor:
    part = scores[..., :evictable]
    return (part - part.mean()) / part.std().clamp(min=1e-12)


class _GivenScores(ScorerPress):
    """A scorer that returns scores kvlab computed during the prefill, so that a head-wise press of
    kvpress shares out the same scores a uniform budget reads."""

    def __init__(self, scores: torch.Tensor):
        super().__init__()
        self.scores = scores

    def score(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.scores.clone()  # kvpress's head-wise presses write into the scores they are given


def headwise_tokens(config: KVCacheConfig, module: AttentionModule, scores: torch.Tensor, keys: torch.Tensor,
                    values: torch.Tensor, n_kept: int, protected: int) -> tuple[torch.Tensor, ...]:
    """Each head's kept indices ``[1, 1, k_h]``, in position order, under ``config``'s head-wise budget.

    kvpress's own press (``AdaKVPress`` or ``CriticalAdaKVPress`` around the given ``scores`` of the
    evictable tokens) picks the ``heads x (evictable - n_kept)`` entries it would mask in attention;
    a head keeps the rest, then the ``protected`` tokens that follow (a query-aware question).
    """
    batch, heads, evictable = scores.shape
    if batch != 1:
        raise ValueError(f"a head-wise budget is applied to one sequence at a time, got a batch of {batch}")
    keep = torch.ones(heads, evictable, dtype=torch.bool, device=scores.device)
    if n_kept < evictable:
        press_name = HEAD_BUDGETS[config.heads].press
        assert press_name is not None  # only a head-wise budget (config.heads != UNIFORM_HEADS) comes here
        press = _kvpress_class(press_name)(press=_GivenScores(scores), alpha_safeguard=config.alpha_safeguard)
        press.compression_ratio = ratio_keeping(evictable, n_kept)
        try:
            press.compress(module, None, keys, values, None, {})
            assert module.masked_key_indices is not None  # a head-wise press's compress sets them
            _, head_index, token_index = module.masked_key_indices
        finally:
            module.masked_key_indices = None
        keep[head_index, token_index] = False
    tail = torch.arange(evictable, evictable + protected, device=scores.device)
    return tuple(torch.cat([row.nonzero().flatten(), tail]).view(1, 1, -1) for row in keep)


def select_tokens(config: KVCacheConfig, layer_scores: list[torch.Tensor | None], layer_keys: list[torch.Tensor],
                  layer_values: list[torch.Tensor], modules: list[AttentionModule], evictable: int,
                  skip_layers: tuple[bool, ...]) -> list[Kept]:
    """Per layer, the kept token indices (:data:`Kept`).

    ``evictable`` is how many leading tokens may be evicted (the context); later tokens are
    always kept.  Budgets count evictable tokens only.  A head-wise budget's count is the heads' mean.
    """
    kept: list[Kept] = [None] * len(layer_keys)
    active = [i for i, skip in enumerate(skip_layers) if not skip]
    if not config.budgets_given or evictable == 0:
        # no prompt budget (no method, or one that compresses during generation only), or nothing
        # that may be evicted (e.g. a one-token served prompt)
        return kept
    protected = layer_keys[active[0]].shape[-2] - evictable
    if config.threshold is not None:
        standardized = {i: _standardized(_scores_of(layer_scores, i), evictable) for i in active}
        pooled = torch.cat([s.flatten() for s in standardized.values()])
        cut = torch.quantile(pooled.double()[:: max(1, pooled.numel() // 2_000_000)], config.threshold).item()
        for i in active:
            n_kept = max(1, round((standardized[i] > cut).sum(dim=-1).float().mean().item()))
            kept[i] = _top_indices(_protect(_scores_of(layer_scores, i), evictable), n_kept + protected)
        return kept
    removed = config.removed_fraction
    method = METHODS[config.evict]
    count = None
    if config.keep_tokens is not None:  # a count: the protected tokens among it, never no context token
        count = max(1, min(evictable, config.keep_tokens - protected))
        removed = ratio_keeping(evictable, count)  # positional scores and per-layer budgets read a ratio
    assert removed is not None  # one budget, not a threshold (above): a fraction, or a count as its ratio
    if method.replays_context:  # one budget across every layer and head (query-aware is refused: nothing protected)
        # (KVzip takes fraction budgets only: no count above)
        for i, layer_kept in zip(active, _replayed_tokens(config, [_scores_of(layer_scores, i) for i in active],
                                                          [modules[i] for i in active], removed), strict=True):
            kept[i] = layer_kept
        return kept
    press = _config_press(config, removed) if method.scorer is None or method.layer_budgets else None
    for i in active:
        if method.scorer is None and press is not None:  # positional: scored here, on the evictable tokens only
            scores = press.score(modules[i], None, layer_keys[i][:, :, :evictable], None, None, {})
            scores = torch.cat([scores, scores.new_ones(*scores.shape[:-1], protected)], dim=-1)
        else:
            scores = _scores_of(layer_scores, i)
        if method.layer_budgets and press is not None:
            n_kept = press.get_layer_budget(modules[i], evictable)
        else:
            n_kept = count if count is not None else compute_n_kept(evictable, removed)
        if config.heads != UNIFORM_HEADS:
            kept[i] = headwise_tokens(config, modules[i], scores[..., :evictable], layer_keys[i][:, :, :evictable],
                                      layer_values[i][:, :, :evictable], min(n_kept, evictable), protected)
        else:
            kept[i] = _top_indices(_protect(scores, evictable), min(n_kept, evictable) + protected)
    return kept


def _scores_of(layer_scores: list[torch.Tensor | None], layer: int) -> torch.Tensor:
    """A layer's prefill scores, which every layer :func:`select_tokens` evicts from has (a scored method)."""
    scores = layer_scores[layer]
    assert scores is not None, f"no prefill scores for layer {layer}"
    return scores


@overload
def gather_tokens(tensor: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor: ...


@overload
def gather_tokens(tensor: torch.Tensor, indices: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]: ...


@overload
def gather_tokens(tensor: torch.Tensor, indices: Kept) -> torch.Tensor | tuple[torch.Tensor, ...]: ...


def gather_tokens(tensor: torch.Tensor, indices: Kept) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """``tensor[b, h, indices[b, h], :]`` (per head: one ``[B, 1, k_h, D]`` each); new tensors, the
    input is not modified."""
    if indices is None:
        return tensor
    if isinstance(indices, tuple):
        return tuple(gather_tokens(tensor[:, head:head + 1], index) for head, index in enumerate(indices))
    return tensor.gather(2, indices.unsqueeze(-1).expand(-1, -1, -1, tensor.shape[-1]))


def gather_layer(keys: torch.Tensor, values: torch.Tensor, indices: Kept) -> LayerKV:
    """A layer's kept keys and values (:func:`gather_tokens`), per head under a head-wise budget."""
    if isinstance(indices, tuple):  # the same calls either way: each branch types one form of LayerKV
        return gather_tokens(keys, indices), gather_tokens(values, indices)
    return gather_tokens(keys, indices), gather_tokens(values, indices)


def kept_positions(kept: list[Kept], tokens: int, layer_windows: tuple[int | None, ...],
                   heads: int) -> KeptPositions:
    """The prompt positions each head of each layer holds once :func:`select_tokens` chose ``kept``: every one
    where it chose none, the last ``window - 1`` in a sliding-window layer (all that it stores)."""
    layers = []
    for indices, window in zip(kept, layer_windows, strict=True):
        if isinstance(indices, tuple):
            layers.append(tuple(tuple(index.flatten().tolist()) for index in indices))
        elif indices is not None:
            layers.append(tuple(tuple(row.tolist()) for row in indices[0]))
        else:
            first = max(0, tokens - window + 1) if window is not None else 0
            layers.append((tuple(range(first, tokens)),) * heads)
    return KeptPositions(tokens, tuple(layers))
