"""The ``kvlab`` attention implementation for transformers models.

Why not plain ``sdpa``: after eviction each layer can hold a different number of tokens
(threshold budgets, PyramidKV), but transformers builds one attention mask for all layers
from the first layer's length.  For batch-1 decoding without padding the mask is fully
determined by the query and key lengths (new tokens attend to every kept token and
causally to each other), so full-attention layers build it themselves, per layer.
Sliding-window layers keep the mask transformers made.

A module flagged with ``kvlab_return_weights`` also returns, in place of the full
``[B, heads, q, k]`` attention matrix, its sum over queries ``[B, heads, 1, k]``: the only
statistic H2O (kvpress's ObservedAttentionPress: ``attentions.sum(2)``) uses, computed a block
of queries at a time instead of materializing a q x k matrix per head (at 2K tokens that
matrix made the prefill 2-3x slower on CPU).

A head-wise layer (:class:`kvlab.compress.cache.HeadwiseLayer`) returns its heads left-padded to
the longest, with each head's padding on the keys; each query head masks its KV head's padding.

Batched decoding (:mod:`kvlab.engines.batched_decode`) passes one ``(keys, values)`` per member of
the batch, as :class:`MemberStates`: each member's query rows attend to its own cache alone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvlab.compress.cache import HEAD_PADDING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kvlab.compress.eviction import AttentionModule

ATTN_IMPLEMENTATION = "kvlab"


class MemberClockLike(Protocol):
    def now(self) -> Any: ...

    def charge(self, member: int, start: Any) -> None: ...


class MemberStates(list):
    """Keys (or values) of each member of a batch, each ``[1, kv_heads, its length, head_dim]``,
    with the clock that charges each member its own attention time."""

    def __init__(self, tensors: list[torch.Tensor], clock: MemberClockLike):
        super().__init__(tensors)
        self.clock = clock



def _lower_right_causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask where query i (the i-th of the last q_len tokens) sees keys up to kv_len - q_len + i."""
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=kv_len - q_len)


def kvlab_attention_forward(module: AttentionModule, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(key, MemberStates):
        return _per_member(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if getattr(module, "is_sliding", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    q_len, kv_len = query.shape[2], key.shape[2]
    weights = None
    if getattr(module, "kvlab_return_weights", False):
        start = time.perf_counter()
        weights = _attention_received(query, key, scaling)
        # H2O's statistic is its scorer's cost, not the prefill's (kvlab.compress.eviction reads this)
        module.kvlab_weights_s = getattr(module, "kvlab_weights_s", 0.0) + time.perf_counter() - start
    mask = None if q_len in (1, kv_len) else _lower_right_causal(q_len, kv_len, query.device)
    if (padding := getattr(key, HEAD_PADDING, None)) is not None:
        unpadded = torch.arange(kv_len, device=query.device) >= padding.to(query.device).unsqueeze(-1)
        heads = unpadded.repeat_interleave(query.shape[1] // key.shape[1], dim=0)[None, :, None, :]
        mask = heads if mask is None else heads & mask
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                            is_causal=mask is None and q_len == kv_len and q_len > 1,
                                            enable_gqa=query.shape[1] != key.shape[1])
    return output.transpose(1, 2).contiguous(), weights


def _per_member(module: AttentionModule, query: torch.Tensor, keys: MemberStates, values: MemberStates,
                attention_mask: torch.Tensor | None, dropout: float, scaling: float | None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """Member ``b``'s query rows against member ``b``'s own keys and values; outputs stacked back."""
    outputs = []
    for index, (key, value) in enumerate(zip(keys, values, strict=True)):
        start = keys.clock.now()
        mask = attention_mask if attention_mask is None or attention_mask.shape[0] == 1 else \
            attention_mask[index:index + 1]
        output, _ = kvlab_attention_forward(module, query[index:index + 1], key, value, mask, dropout, scaling,
                                            **kwargs)
        keys.clock.charge(index, start)
        outputs.append(output)
    return torch.cat(outputs), None


def _attention_received(query: torch.Tensor, key: torch.Tensor, scaling: float | None,
                        block: int = 256) -> torch.Tensor:
    """Causal softmax attention summed over queries, ``[B, heads, 1, kv_len]``, in query blocks."""
    q_len, kv_len = query.shape[2], key.shape[2]
    keys_t = repeat_kv(key, query.shape[1] // key.shape[1]).transpose(2, 3)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    offset = kv_len - q_len
    total = query.new_zeros(query.shape[0], query.shape[1], 1, kv_len, dtype=torch.float32)
    for start in range(0, q_len, block):
        end = min(start + block, q_len) + offset  # keys after the block's last query are masked anyway
        scores = torch.matmul(query[:, :, start:start + block], keys_t[..., :end]).mul_(scale)
        rows = torch.arange(start, start + scores.shape[2], device=query.device).unsqueeze(1) + offset
        scores.masked_fill_(torch.arange(end, device=query.device) > rows, float("-inf"))
        total[..., :end] += torch.softmax(scores, dim=-1, dtype=torch.float32).sum(dim=2, keepdim=True)
    return total.to(query.dtype)


def install(model: PreTrainedModel) -> None:
    """Register the implementation (idempotent) and switch ``model`` to it."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvlab_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
