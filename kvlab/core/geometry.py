"""The shape of a model's KV cache and its one bytes formula, for every engine (kvlab's own, a launched server,
an endpoint whose model kvlab knows).

One token's keys and values in one layer take ``2 (K and V) x kv_heads x head_dim x bits / 8`` bytes; a
sliding-window layer holds at most its window.  :mod:`kvlab.compress.accounting` builds the compressed
layouts' bytes on it; a launched server's pool is checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass

BASELINE_BITS = 16  # the uncompressed reference: 16-bit keys and values


@dataclass(frozen=True)
class CacheGeometry:
    """``num_layers`` x K and V x ``num_kv_heads`` x ``head_dim``; ``layer_windows``: each layer's sliding window,
    None for full attention (every layer full when not given)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (None,) * self.num_layers)
        if len(self.layer_windows) != self.num_layers:
            raise ValueError(f"{len(self.layer_windows)} layer windows for {self.num_layers} layers")

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        return tuple(w is not None for w in self.layer_windows)

    def layer_bytes_per_token(self, bits: float = BASELINE_BITS) -> float:
        """One token's keys and values in one layer at ``bits`` per element."""
        return 2 * self.num_kv_heads * self.head_dim * bits / 8

    def bytes_per_token(self, bits: float = BASELINE_BITS, layers_16bit: int = 0) -> float:
        """One token's keys and values in every layer at ``bits`` per element (a server's pool of one dtype), but
        ``layers_16bit`` of them at 16 bits (a server's 16-bit layers under a quantized cache)."""
        return ((self.num_layers - layers_16bit) * self.layer_bytes_per_token(bits)
                + layers_16bit * self.layer_bytes_per_token(BASELINE_BITS))

    def baseline_bytes(self, tokens: int) -> int:
        """16-bit bytes of an uncompressed cache holding ``tokens`` tokens (batch 1), windows applied."""
        per_token = round(self.layer_bytes_per_token())
        return sum(per_token * (tokens if w is None else min(tokens, w)) for w in self.layer_windows)

    def formula(self, bits: float, layers_16bit: int = 0) -> str:
        """:meth:`bytes_per_token` in words (``30 layers x 2 x 3 KV heads x 64 x 2 B``)."""
        per_layer = f"2 x {self.num_kv_heads} KV heads x {self.head_dim}"
        if not layers_16bit:
            return f"{self.num_layers} layers x {per_layer} x {bits / 8:g} B"
        return (f"{self.num_layers - layers_16bit} layers x {per_layer} x {bits / 8:g} B + {layers_16bit} 16-bit "
                f"layers x {per_layer} x 2 B")
