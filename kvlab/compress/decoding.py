"""Compression during generation: kvpress's ``DecodingPress`` on kvlab's compressed caches.

kvpress (0.5.5) compresses during decoding from a forward hook on each attention layer: every pass
after the prefill appends the layer's input hidden states to a buffer and counts one step; when the
count reaches ``compression_interval`` (or a pass brings ``target_size`` tokens or more), the
layer's whole cache is scored by the base press from the buffered hidden states and cut back to
``target_size`` tokens; the count restarts and the buffer empties; the buffer then keeps its last
``hidden_states_buffer_size`` entries.  ``CompressionRatioDecodingPress`` targets ``1 - ratio`` of
all tokens seen so far instead.

:class:`DecodeCompressor` does the same for each cache it tracks, in a hook on the same modules,
so a batch of configs (:mod:`kvlab.engines.batched_decode`) or one served request compresses as
kvpress would, each member with its own policy, buffer and count.  Two differences, both kvlab's
cache rather than the policy: kept tokens stay in position order, and a quantized layer is rebuilt
from what attention saw (its codes dequantized) and quantized again, as a new layer would be.
The time a member spends compressing is charged to it (the batch's member clock).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn

from kvlab.compress.cache import CompressedLayer, KVLabCache
from kvlab.compress.eviction import AttentionModule, gather_tokens, make_press, ratio_keeping, share_rotary_embedding
from kvlab.core.kv_config import DecodePolicy, KVCacheConfig
from kvlab.core.methods import METHODS


@dataclass
class _Tracked:
    """One cache's decode-time state: its policy and press, and per layer the buffered hidden states
    (a list of entries, one per pass, as kvpress keeps them) and the passes since the last compression.
    ``count_tokens``: a pass of n tokens counts n steps (a teacher-forced copy fed a chunk at once
    in place of n one-token passes)."""

    cache: KVLabCache  # held, so that its id cannot be another cache's while it is tracked
    policy: DecodePolicy
    press: ScorerPress
    buffers: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    count_tokens: bool = False

    def target(self, position: int) -> int:
        """Tokens to keep when the pass's last token sits at sequence ``position``."""
        if self.policy.target_tokens is not None:
            return self.policy.target_tokens
        assert self.policy.ratio is not None  # DecodePolicy holds exactly one of the two
        return max(1, int((position + 1) * (1 - self.policy.ratio)))


def decode_press(config: KVCacheConfig, seed: int) -> ScorerPress:
    """The press that scores ``config``'s cache during generation (its method and parameters, no budget)."""
    method = METHODS[config.evict]
    return make_press(method, {name: getattr(config, name) for name in method.params}, seed)


class DecodeCompressor:
    """Applies each tracked cache's :class:`DecodePolicy` during the forward passes of generation.

    ``track`` each cache (or ``fork`` a copy of one), then run the passes inside :meth:`attached`.
    Passes over caches it does not track, and sliding-window layers, are left alone."""

    def __init__(self, model: nn.Module, modules: Sequence[AttentionModule], skip_layers: Sequence[bool], seed: int):
        self.model = model
        self.modules = list(modules)
        self.skip_layers = tuple(skip_layers)
        self.seed = seed
        self._tracked: dict[int, _Tracked] = {}

    def track(self, cache: KVLabCache, config: KVCacheConfig) -> None:
        if config.decode is not None:
            press = decode_press(config, self.seed)
            press.post_init_from_model(self.model)
            self._tracked[id(cache)] = _Tracked(cache, config.decode, press)

    def fork(self, cache: KVLabCache, twin: KVLabCache) -> None:
        """Track ``twin`` (a deep copy of ``cache``) from ``cache``'s state on, counting tokens."""
        if (state := self._tracked.get(id(cache))) is not None:
            self._tracked[id(twin)] = _twin_state(state, twin)

    def steps_left(self, cache: KVLabCache) -> int | None:
        """Tokens ``cache`` may be fed before its next compression (None: it has no policy)."""
        state = self._tracked.get(id(cache))
        if state is None:
            return None
        return max(1, state.policy.interval - max(state.steps.values(), default=0))

    @contextmanager
    def attached(self) -> Iterator[DecodeCompressor]:
        share_rotary_embedding(self.model)
        handles = [module.register_forward_hook(self._hook, with_kwargs=True)
                   for module, skip in zip(self.modules, self.skip_layers, strict=True) if not skip]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def _hook(self, module: AttentionModule, args: tuple, kwargs: dict, output: Any) -> None:
        cache = kwargs["past_key_values"]
        members: list[KVLabCache] = list(getattr(cache, "members", [cache]))
        clock = getattr(cache, "clock", None)
        for row, member in enumerate(members):
            state = self._tracked.get(id(member))
            if state is None:
                continue
            start = clock.now() if clock is not None else None
            self._step(module, state, member, row, kwargs)
            if clock is not None:
                clock.charge(row, start)

    def _step(self, module: AttentionModule, state: _Tracked, cache: KVLabCache, row: int, kwargs: dict) -> None:
        """kvpress's ``DecodingPress.forward_hook`` for one member's row of the pass."""
        layer = module.layer_idx
        hidden = kwargs["hidden_states"][row:row + 1]
        q_len = hidden.shape[1]
        buffer = state.buffers.setdefault(layer, [])
        entry = hidden.detach().clone()
        buffer.extend(entry.split(1, dim=1) if state.count_tokens else [entry])
        state.steps[layer] = state.steps.get(layer, 0) + (q_len if state.count_tokens else 1)
        position = int(kwargs["position_ids"][row].max()) if kwargs.get("position_ids") is not None else None
        if position is None:
            raise RuntimeError("decode-time compression needs the pass's position_ids")
        target = state.target(position)
        # kvpress also compresses a pass that alone brings the target or more (a long question)
        if state.steps[layer] >= state.policy.interval or (q_len >= target and not state.count_tokens):
            # a full-attention layer (sliding ones are not hooked) of one count per head (a decode policy refuses
            # head-wise budgets)
            compressed = cast(CompressedLayer, cache.layers[layer])
            self._compress(module, state, compressed, torch.cat(buffer, dim=1), target, row, kwargs)
            state.steps[layer] = 0
            buffer.clear()
        size = state.policy.buffer
        state.buffers[layer] = buffer[-size:] if size > 0 else []

    def _compress(self, module: AttentionModule, state: _Tracked, layer: CompressedLayer, hidden: torch.Tensor,
                  target: int, row: int, kwargs: dict) -> None:
        keys, values = layer.materialize()
        if keys.shape[-2] <= target:  # kvpress: a ratio of 0, nothing removed
            return
        cos, sin = kwargs["position_embeddings"]
        scored = {**kwargs, "hidden_states": hidden, "position_embeddings": (cos[row:row + 1], sin[row:row + 1])}
        # as DecodingPress.compress: the base press gets the ratio that keeps exactly ``target`` tokens
        # (StreamingLLM's scores read it)
        ratio = ratio_keeping(keys.shape[-2], target)
        state.press.compression_ratio = ratio
        scores = state.press.score(module, hidden, keys, values, None, scored)
        kept = scores.topk(compute_n_kept(keys.shape[-2], ratio), dim=-1).indices.sort(dim=-1).values
        layer.replace_tokens(gather_tokens(keys, kept), gather_tokens(values, kept))


def _twin_state(state: _Tracked, cache: KVLabCache) -> _Tracked:
    """A copy of ``state`` for ``cache``, a teacher-forced twin: same buffers and counts, counting tokens."""
    twin = copy.copy(state)
    twin.cache = cache
    twin.buffers = {layer: list(entries) for layer, entries in state.buffers.items()}
    twin.steps = dict(state.steps)
    twin.count_tokens = True
    return twin
