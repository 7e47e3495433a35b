"""The kvlab attention implementation against plain eager attention."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kvlab.engines.attention import _attention_received, kvlab_attention_forward


def _eager(query, key, value, offset):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    weights = query @ key.transpose(2, 3) / query.shape[-1] ** 0.5
    q_len, kv_len = query.shape[2], key.shape[2]
    allowed = torch.arange(kv_len) <= torch.arange(q_len).unsqueeze(1) + offset
    weights = weights.masked_fill(~allowed, float("-inf")).softmax(-1)
    return (weights @ value).transpose(1, 2), weights


def test_new_tokens_see_every_kept_token_and_each_other_causally():
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 9, 5, 64, generator=generator), torch.randn(1, 3, 40, 64, generator=generator),
                         torch.randn(1, 3, 40, 64, generator=generator))
    module = SimpleNamespace(kvlab_return_weights=True)
    output, received = kvlab_attention_forward(module, query, key, value, attention_mask=None)
    expected, weights = _eager(query, key, value, offset=35)
    assert torch.allclose(output, expected, atol=1e-5)
    assert torch.allclose(received, weights.sum(2, keepdim=True), atol=1e-4)


def test_attention_received_in_blocks_equals_full_matrix():
    query, key = torch.randn(1, 6, 300, 32), torch.randn(1, 2, 300, 32)
    _, weights = _eager(query, key, torch.randn(1, 2, 300, 32), offset=0)
    assert torch.allclose(_attention_received(query, key, None, block=64), weights.sum(2, keepdim=True), atol=1e-4)
