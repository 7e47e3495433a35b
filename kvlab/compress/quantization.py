"""Real quantized storage: packed integer codes with scales and zero points, and fp8.

Nothing here fake-quantizes: a :class:`QuantizedBlock` holds only the packed codes and
their (de)quantization parameters, and ``dequantize`` rebuilds the floats when attention
needs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Literal

import torch

from kvlab.core.formats import FORMATS, FP8_MAX, INT_BITS

#: fp8 format name -> the torch dtype its codes are stored in.
FP8_DTYPES = {name: getattr(torch, FORMATS[name].storage_dtype) for name in FP8_MAX}
Axis = Literal["channel", "token"]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned ``bits``-bit codes (uint8, last dim divisible by 8 // bits) into bytes."""
    if bits == 8:
        return codes
    per_byte = 8 // bits
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per_byte, per_byte)
    shifts = torch.arange(per_byte, device=codes.device, dtype=torch.uint8) * bits
    return (grouped << shifts).sum(dim=-1, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`."""
    if bits == 8:
        return packed
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, device=packed.device, dtype=torch.uint8) * bits
    mask = (1 << bits) - 1
    codes = (packed.unsqueeze(-1) >> shifts) & mask
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


@dataclass
class QuantizedBlock:
    """Quantized K or V of one layer for a run of tokens: ``[batch, heads, tokens, head_dim]``."""

    codes: torch.Tensor  # uint8 packed codes, or float8
    scale: torch.Tensor
    zero: torch.Tensor | None  # int formats: the group minimum; fp8: None
    fmt: str
    axis: Axis
    group: int
    tokens: int
    head_dim: int
    rotated: bool = False  # the codes hold H x (a Hadamard transform of each head's vector): undone on dequantize

    @property
    def nbytes(self) -> int:
        tensors = [self.codes, self.scale] + ([self.zero] if self.zero is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def hadamard(head_dim: int, device: torch.device) -> torch.Tensor:
    """The orthonormal Hadamard matrix of ``head_dim`` (a power of two; Sylvester's construction, divided by
    sqrt(head_dim)): symmetric and its own inverse, so ``x @ H @ H == x``.  The rotation llama.cpp applies to
    quantized K and V (``attn_rot_k``/``attn_rot_v``) and vLLM's TurboQuant to its keys: it spreads an outlier
    channel over all of them before the values are grouped and quantized."""
    return _hadamard(head_dim, str(device))


@cache
def _hadamard(head_dim: int, device: str) -> torch.Tensor:
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"a Hadamard rotation needs a head dimension that is a power of two, not {head_dim}")
    matrix = torch.ones(1, 1)
    while matrix.shape[0] < head_dim:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return (matrix / math.sqrt(head_dim)).to(device)


def quantize(x: torch.Tensor, fmt: str, axis: Axis, group: int, rotate: bool = False) -> QuantizedBlock:
    """Quantize ``x`` ``[B, H, T, D]``.

    Integer formats are asymmetric min-max per group: ``axis="channel"`` groups ``group``
    consecutive tokens of one channel (KIVI keys; T must be a multiple of ``group``),
    ``axis="token"`` groups ``group`` consecutive channels of one token (KIVI values).
    fp8 scales each head and run of ``group`` tokens by its absolute maximum.  ``"none"`` holds
    ``x`` at 16-bit (the unquantized half of a config whose keys and values differ: K8V16).
    ``rotate``: each head's vector is rotated (:func:`hadamard`) before it is grouped and quantized; the bytes are
    the same (the rotation is a fixed matrix, not stored).
    """
    batch, heads, tokens, head_dim = x.shape
    if fmt == "none":
        return QuantizedBlock(x.to(torch.float16), x.new_empty(0), None, fmt, axis, group, tokens, head_dim)
    xf = x.float()
    if rotate:
        xf = xf @ hadamard(head_dim, xf.device)
    if fmt in FP8_DTYPES:
        fmax = FP8_MAX[fmt]
        grouped = xf.reshape(batch, heads, tokens // group, group, head_dim)
        scale = (grouped.abs().amax(dim=(3, 4), keepdim=True) / fmax).clamp(min=1e-12)
        codes = (grouped / scale).clamp(-fmax, fmax).to(FP8_DTYPES[fmt]).reshape(batch, heads, tokens, head_dim)
        return QuantizedBlock(codes, scale, None, fmt, axis, group, tokens, head_dim, rotate)
    bits = INT_BITS[fmt]
    levels = (1 << bits) - 1
    if axis == "channel":
        grouped = xf.reshape(batch, heads, tokens // group, group, head_dim)
        lo, hi = grouped.amin(dim=3, keepdim=True), grouped.amax(dim=3, keepdim=True)
    else:
        grouped = xf.reshape(batch, heads, tokens, head_dim // group, group)
        lo, hi = grouped.amin(dim=4, keepdim=True), grouped.amax(dim=4, keepdim=True)
    scale = ((hi - lo) / levels).clamp(min=1e-8)
    codes = ((grouped - lo) / scale).round().clamp(0, levels).to(torch.uint8)
    packed = pack_codes(codes.reshape(batch, heads, tokens, head_dim), bits)
    return QuantizedBlock(packed, scale.half(), lo.half(), fmt, axis, group, tokens, head_dim, rotate)


def dequantize(block: QuantizedBlock, dtype: torch.dtype) -> torch.Tensor:
    """Rebuild ``[B, H, T, D]`` floats from a block (a rotated one rotated back)."""
    if block.fmt == "none":
        return block.codes.to(dtype)
    values = _dequantized(block)
    if block.rotated:
        values = values @ hadamard(block.head_dim, values.device)
    return values.to(dtype)


def _dequantized(block: QuantizedBlock) -> torch.Tensor:
    """The block's float32 values, as quantized (still rotated where it was)."""
    if block.fmt in FP8_DTYPES:
        batch, heads, tokens, head_dim = block.codes.shape
        grouped = block.codes.float().reshape(batch, heads, tokens // block.group, block.group, head_dim)
        return (grouped * block.scale).reshape(batch, heads, tokens, head_dim)
    codes = unpack_codes(block.codes, INT_BITS[block.fmt]).float()
    batch, heads, tokens, head_dim = codes.shape
    if block.axis == "channel":
        grouped = codes.reshape(batch, heads, tokens // block.group, block.group, head_dim)
    else:
        grouped = codes.reshape(batch, heads, tokens, head_dim // block.group, block.group)
    assert block.zero is not None  # an int format: quantize() gives it its zero points
    values = grouped * block.scale.float() + block.zero.float()
    return values.reshape(batch, heads, tokens, head_dim)
