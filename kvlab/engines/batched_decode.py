"""Decode several KV configs of one item as one batch: the weights are read once per step for all.

Every member holds its own compressed cache (own length, quantization, kept tokens).  The model
runs on ``[members, q]`` input ids: embeddings, projections, MLP and head are batched; for each
layer :class:`BatchedCache` splits the new keys/values by member, appends each to that member's
own cache layer, and hands the attention (``kvlab.engines.attention``) one ``(keys, values)`` per
member, which it attends to separately.  All members of a group share the prompt layout, so they
share positions too.  Members leave the batch as they finish.

Fidelity: every member is compared, position by position, with the baseline's run of the same
item -- a member of the same batch (``reference=<its index>``: the baseline, reported or not), or
one decoded before (a :class:`Reference`, for later sub-batches).  Until a member's greedy token
leaves the baseline's, its own decoding *is* the teacher-forced run (same tokens in, same cache).
Where it leaves, a copy of its cache is kept; once the baseline has finished, the copy is fed the
rest of the baseline's tokens in one forward pass (teacher forcing; charged to no one; split only
where a quantized cache would move its tail into codes mid-way) while the member went on with its
own tokens.  So fidelity costs no extra prefill, no extra decode step, and a short forward pass
or two per member that diverges.

Timing, as if each member ran alone: each member's own work (its cache update, dequantization and
attention) is timed apart; the rest of a pass (projections, MLP, head) is the same for every member,
and is charged at what it costs alone, measured once per batch on one member run alone
(:class:`_ChargedForward`; ``docs/decisions.md``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

from kvlab.compress.cache import KVLabCache
from kvlab.compress.decoding import DecodeCompressor
from kvlab.core.geometry import CacheGeometry
from kvlab.core.results import TEACHER_BASELINE_OUTPUT, TEACHER_CONTINUATION, Fidelity
from kvlab.engines.attention import MemberStates

#: Share of the free memory (host RAM, or GPU memory on CUDA) a batch may plan to use.
MEMORY_SHARE = 0.5


class MemberClock:
    """Seconds of each member's own work during one forward pass.  On CUDA, kernels run
    asynchronously: CUDA events mark each member's work, read after the pass, so that timing never
    stalls the batch."""

    def __init__(self, members: int, device: torch.device):
        self._seconds = [0.0] * members
        self._cuda = device.type == "cuda"
        self._pending: list[tuple[int, Any, Any]] = []  # (member, start event, end event)

    def now(self) -> Any:
        """A mark to pass to :meth:`charge`: a time, or on CUDA a recorded event."""
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def charge(self, member: int, start: Any) -> None:
        if self._cuda:
            self._pending.append((member, start, self.now()))
        else:
            self._seconds[member] += time.perf_counter() - start

    @property
    def seconds(self) -> list[float]:
        if self._pending:
            torch.cuda.synchronize()
            for member, start, end in self._pending:
                self._seconds[member] += start.elapsed_time(end) / 1000
            self._pending.clear()
        return self._seconds


def wall_clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class BatchedCache(Cache):
    """The caches of a batch's members, seen by the model as one cache of batch size ``len(members)``.

    Masks and sequence lengths come from the first member; the kvlab attention ignores them on
    full-attention layers (it builds each member's mask from its own length), and sliding-window
    layers are never evicted, so every member has the same length there."""

    def __init__(self, members: Sequence[KVLabCache], clock: MemberClock):
        super().__init__(layers=members[0].layers)
        self.members = list(members)
        self.clock = clock

    # transformers types update() as returning tensors, but hands whatever it returns to the attention function
    # alone: kvlab's (kvlab.engines.attention), which takes MemberStates
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,  # type: ignore[override]
               cache_kwargs: dict[str, Any] | None = None) -> tuple[MemberStates, MemberStates]:
        keys, values = [], []
        for index, member in enumerate(self.members):
            start = self.clock.now()
            k, v = member.layers[layer_idx].update(key_states[index:index + 1], value_states[index:index + 1],
                                                   cache_kwargs)
            self.clock.charge(index, start)
            keys.append(k)
            values.append(v)
        return MemberStates(keys, self.clock), MemberStates(values, self.clock)


@dataclass(frozen=True)
class Reference:
    """The baseline's run of one item, which every other config is compared with: the tokens it is
    teacher-forced on (the baseline's greedy output, or the continuation) and the baseline's
    log-probabilities of the next token at each of them, ``[tokens, vocab]``."""

    tokens: list[int]
    logprobs: torch.Tensor
    teacher: str

    @property
    def top1(self) -> list[int]:
        return self.logprobs.argmax(dim=-1).tolist()


def token_kl(reference_logprobs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_reference || p) in nats along the last axis; ``logits`` are the config's, unnormalized."""
    logprobs = F.log_softmax(logits.float(), dim=-1)
    return (reference_logprobs.exp() * (reference_logprobs - logprobs)).sum(dim=-1).clamp_min(0.0)


def token_kl_variance(reference_logprobs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Var over y ~ p_reference of log p_reference(y) - log p(y), along the last axis: the noise of one sampled
    token's log-ratio as an estimate of :func:`token_kl` (the sampled estimator's, :mod:`kvlab.analysis.sampled_kl`);
    ``logits`` are the config's, unnormalized."""
    ratio = reference_logprobs - F.log_softmax(logits.float(), dim=-1)
    probs = reference_logprobs.exp()
    kl = torch.where(probs > 0, probs * ratio, 0.0).sum(dim=-1, keepdim=True)
    return torch.where(probs > 0, probs * (ratio - kl) ** 2, 0.0).sum(dim=-1)


@dataclass
class _Trace:
    """One member's fidelity so far, position by position."""

    kl: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    diverged: bool = False  # its own greedy tokens have left the reference's

    def add(self, kl: float, agree: bool) -> None:
        self.kl.append(kl)
        self.agree.append(agree)

    def fidelity(self, teacher: str) -> Fidelity | None:
        return Fidelity(tuple(self.kl), tuple(self.agree), teacher) if self.kl else None


@dataclass
class _Twin:
    """A diverged member's cache as it was when it left the reference: fed the reference's
    remaining tokens once the reference is known."""

    member: int
    cache: KVLabCache
    at: int  # the position (index into the reference's tokens) whose prediction diverged
    position: int  # the sequence position the next fed token takes


class _ReferenceRun:
    """The reference's tokens and log-probabilities, known ahead (a :class:`Reference`) or growing
    step by step (the batch's own baseline member)."""

    def __init__(self, given: Reference | None, teacher: str):
        self.tokens: list[int] = list(given.tokens) if given else []
        self.logprobs: list[torch.Tensor] = list(given.logprobs) if given else []
        self.top1: list[int] = given.top1 if given else []
        self.teacher = given.teacher if given else teacher

    def add(self, logits: torch.Tensor, token: int) -> None:
        logprobs = F.log_softmax(logits.float(), dim=-1)
        self.logprobs.append(logprobs)
        self.top1.append(int(logprobs.argmax()))
        self.tokens.append(token)

    def frozen(self) -> Reference:
        return Reference(list(self.tokens), torch.stack(self.logprobs), self.teacher)


@dataclass
class MemberOutcome:
    """One member's result: its generated ids (greedy) or its NLL (perplexity), its charged time,
    its fidelity against the reference, and -- for the reference member -- the reference itself
    (for the configs of later sub-batches)."""

    generated: list[int] = field(default_factory=list)
    #: The cache over the generation: (tokens seen, measured bytes) after each forward pass
    kv_trace: list[tuple[int, int]] = field(default_factory=list)
    nll: float | None = None
    first_s: float = 0.0
    decode_s: float = 0.0
    fidelity: Fidelity | None = None
    reference: Reference | None = None


def finished(generated: list[int], stop_ids: set[int], max_new_tokens: int, stop: Sequence[str],
             decode: Callable[[list[int]], str]) -> bool:
    """Whether greedy decoding ends after ``generated``: an end token, ``max_new_tokens``, or a stop string."""
    if generated[-1] in stop_ids or len(generated) >= max_new_tokens:
        return True
    return bool(stop) and any(s in decode(generated) for s in stop)


def _forward(model: torch.nn.Module, caches: Sequence[KVLabCache], input_ids: torch.Tensor,
             positions: torch.Tensor, logits_to_keep: int,
             device: torch.device) -> tuple[torch.Tensor, float, list[float]]:
    """One batched forward: its logits, its shared seconds (all but the members' own work) and each
    member's own seconds."""
    clock = MemberClock(len(caches), device)
    start = wall_clock(device)
    logits = model(input_ids=input_ids, past_key_values=BatchedCache(caches, clock), position_ids=positions,
                   logits_to_keep=logits_to_keep).logits
    own = clock.seconds
    return logits, max(wall_clock(device) - start - sum(own), 0.0), own


class _ChargedForward:
    """Forward passes of one shape (the suffix, or one decode step), each member charged as if alone.

    The shared part of a pass (embeddings, projections, MLP, head) is the same work for every
    member, but batched it costs more than alone.  So the first time, the first member runs alone
    and the rest as a batch: that member's pass is measured exactly, and its shared part is each
    other member's charge, plus their own measured cache and attention time."""

    def __init__(self, model: torch.nn.Module, logits_to_keep: int, device: torch.device):
        self.model, self.logits_to_keep, self.device = model, logits_to_keep, device
        self.solo_shared: float | None = None

    def __call__(self, caches: Sequence[KVLabCache], input_ids: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
        if self.solo_shared is None or len(caches) == 1:
            logits, shared, own = _forward(self.model, caches[:1], input_ids[:1], positions[:1], self.logits_to_keep,
                                           self.device)
            self.solo_shared, charged = shared, [shared + own[0]]
            if len(caches) == 1:
                return logits, charged
            rest, _, own = _forward(self.model, caches[1:], input_ids[1:], positions[1:], self.logits_to_keep,
                                    self.device)
            return torch.cat([logits, rest]), charged + [self.solo_shared + seconds for seconds in own]
        logits, _, own = _forward(self.model, caches, input_ids, positions, self.logits_to_keep, self.device)
        return logits, [self.solo_shared + seconds for seconds in own]


def decode_batch(model: torch.nn.Module, caches: Sequence[KVLabCache], suffix: list[int], position: int,
                 targets: list[int] | None, max_new_tokens: int, stop: Sequence[str], stop_ids: set[int],
                 decode: Callable[[list[int]], str], reference: Reference | int | None = None,
                 compressor: DecodeCompressor | None = None) -> list[MemberOutcome]:
    """Feed ``suffix`` (at ``position``) to every member, then score ``targets`` (perplexity) or
    decode greedily until each member finishes; the caches are updated in place.  ``reference``:
    measure every other member's fidelity against that member (its index) or that earlier run.
    ``compressor``: the decode-time policies of the caches it tracks, applied during every pass."""
    with compressor.attached() if compressor is not None else contextlib.nullcontext():
        return _decode_batch(model, caches, suffix, position, targets, max_new_tokens, stop, stop_ids, decode,
                             reference, compressor)


def _decode_batch(model: torch.nn.Module, caches: Sequence[KVLabCache], suffix: list[int], position: int,
                  targets: list[int] | None, max_new_tokens: int, stop: Sequence[str], stop_ids: set[int],
                  decode: Callable[[list[int]], str], reference: Reference | int | None,
                  compressor: DecodeCompressor | None) -> list[MemberOutcome]:
    device = next(model.parameters()).device
    count = len(caches)
    outcomes = [MemberOutcome() for _ in caches]
    traces = [_Trace() for _ in caches]
    own = reference if isinstance(reference, int) else None  # the reference member, if in this batch
    earlier = None if isinstance(reference, int) else reference  # the reference's earlier run, if given
    teacher = TEACHER_CONTINUATION if targets is not None else TEACHER_BASELINE_OUTPUT
    ref = None if reference is None else _ReferenceRun(earlier, teacher)
    ids = torch.tensor([suffix], device=device).expand(count, -1)
    positions = torch.arange(position, position + len(suffix), device=device).unsqueeze(0).expand(count, -1)
    first = _ChargedForward(model, 0 if targets is not None else 1, device)
    logits, charged = first(caches, ids, positions)
    position += len(suffix)
    for outcome, seconds, cache in zip(outcomes, charged, caches, strict=True):
        outcome.first_s = seconds
        outcome.kv_trace.append((position, cache.physical_bytes))
    if targets is not None:
        _score_targets(logits, targets, outcomes, traces, ref, own)
        return _finish(outcomes, traces, ref, own)
    step = _ChargedForward(model, 1, device)
    active = list(range(count))
    twins: list[_Twin] = []
    at = 0  # the index of the token being produced
    while True:
        last = logits[:, -1]
        next_ids = last.argmax(dim=-1).tolist()
        rows = dict(zip(active, range(len(active)), strict=True))
        if own is not None and own in rows and ref is not None:  # (a reference member: ref is its run)
            ref.add(last[rows[own]], next_ids[rows[own]])
        compared = ref if ref is not None and at < len(ref.tokens) else None  # the run, while it has a token
        kls = token_kl(compared.logprobs[at], last).tolist() if compared is not None else []  # every row at once
        still: list[tuple[int, int]] = []  # (member, its next id)
        for member, next_id in zip(active, next_ids, strict=True):
            generated = outcomes[member].generated
            generated.append(next_id)
            done = finished(generated, stop_ids, max_new_tokens, stop, decode)
            if compared is not None and member != own and not traces[member].diverged:
                trace = traces[member]
                trace.add(kls[rows[member]], next_id == compared.top1[at])
                if next_id != compared.tokens[at]:
                    trace.diverged = True  # its cache so far is the teacher-forced one: keep a copy
                    twin = _Twin(member, copy.deepcopy(caches[member]), at, position)
                    if compressor is not None:
                        compressor.fork(caches[member], twin.cache)
                    twins.append(twin)
            if not done:
                still.append((member, next_id))
        if not still:
            break
        active = [member for member, _ in still]
        ids = torch.tensor([[next_id] for _, next_id in still], device=device)
        positions = torch.full((len(active), 1), position, device=device)
        logits, charged = step([caches[m] for m in active], ids, positions)
        position += 1
        for member, seconds in zip(active, charged, strict=True):
            outcomes[member].decode_s += seconds
            outcomes[member].kv_trace.append((position, caches[member].physical_bytes))
        at += 1
    if ref is not None:  # (twins diverged from it: none without one)
        for twin in twins:
            _teacher_force(model, twin, ref, traces[twin.member], device, compressor)
    return _finish(outcomes, traces, ref, own)


def teacher_forced(model: torch.nn.Module, cache: KVLabCache, tokens: Sequence[int], position: int,
                   device: torch.device, compressor: DecodeCompressor | None = None,
                   logits_to_keep: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
    """Feed ``tokens`` to ``cache`` from sequence ``position`` on, in as few forward passes as give the
    attention a token-by-token decode would: a pass ends where a quantized layer moves its full-precision
    tail into codes (after that, later tokens see codes, earlier ones did not), and where a decode policy
    compresses the cache (``compressor``, which must count the tokens of a pass: a teacher-forced copy's
    state, :meth:`DecodeCompressor.fork`).  Yields each pass's offset into ``tokens`` and its logits
    (``[tokens of the pass, vocab]``; its last ``logits_to_keep`` rows when that is not 0)."""
    done = 0
    while done < len(tokens):
        limits = [n for n in (cache.tokens_before_flush(),
                              compressor.steps_left(cache) if compressor is not None else None) if n is not None]
        chunk = list(tokens[done:done + min(limits, default=len(tokens))])
        start = position + done
        positions = torch.arange(start, start + len(chunk), device=device).unsqueeze(0)
        logits = model(input_ids=torch.tensor([chunk], device=device), past_key_values=cache,
                       position_ids=positions, logits_to_keep=logits_to_keep).logits[0]
        yield done, logits
        done += len(chunk)


def _teacher_force(model: torch.nn.Module, twin: _Twin, ref: _ReferenceRun, trace: _Trace,
                   device: torch.device, compressor: DecodeCompressor | None = None) -> None:
    """The rest of a diverged member's fidelity: its cache copy fed the reference's tokens after the
    divergence (:func:`teacher_forced`), each position compared with the reference's."""
    fed = ref.tokens[twin.at:len(ref.tokens) - 1]
    for done, logits in teacher_forced(model, twin.cache, fed, twin.position, device, compressor):
        first = twin.at + 1 + done
        wanted = torch.stack(ref.logprobs[first:first + len(logits)])
        for kl, top1, ref_top1 in zip(token_kl(wanted, logits).tolist(), logits.argmax(dim=-1).tolist(),
                                      ref.top1[first:first + len(logits)], strict=True):
            trace.add(kl, top1 == ref_top1)


def _score_targets(logits: torch.Tensor, targets: list[int], outcomes: list[MemberOutcome], traces: list[_Trace],
                   ref: _ReferenceRun | None, own: int | None) -> None:
    """A perplexity item: every member's NLL of ``targets``, and its fidelity over the same positions."""
    target_ids = torch.tensor(targets, device=logits.device)
    for index, outcome in enumerate(outcomes):
        outcome.nll = F.cross_entropy(logits[index].float(), target_ids, reduction="sum").item()
    if ref is None:
        return
    if own is not None:
        for row, token in zip(logits[own], targets, strict=True):
            ref.add(row, token)
    wanted = torch.stack(ref.logprobs)
    for index, trace in enumerate(traces):
        if index != own:
            trace.kl = token_kl(wanted, logits[index]).tolist()
            trace.agree = [a == b for a, b in zip(logits[index].argmax(dim=-1).tolist(), ref.top1, strict=True)]


def _finish(outcomes: list[MemberOutcome], traces: list[_Trace], ref: _ReferenceRun | None,
            own: int | None) -> list[MemberOutcome]:
    if ref is not None:
        for outcome, trace in zip(outcomes, traces, strict=True):
            outcome.fidelity = trace.fidelity(ref.teacher)
        if own is not None:
            outcomes[own].reference = ref.frozen()
    return outcomes


def member_bytes(geometry: CacheGeometry, tokens: int, fed_tokens: int, vocab_size: int,
                 compute_bytes: int) -> int:
    """What one more member may add to a batch at most: its cache kept whole at 16-bit (the baseline;
    compressed members hold less), its quantized blocks' floats kept at the compute dtype for the item's decode
    (every layer: :class:`kvlab.compress.cache.CompressedLayer`), one layer's keys and values rebuilt at the
    compute dtype (twice: the blocks' floats and the tail, and their concatenation), and its float32 logits for
    ``fed_tokens`` tokens (twice: the cross-entropy's float copy)."""
    full_layer = 2 * geometry.num_kv_heads * geometry.head_dim * tokens * compute_bytes
    floats = geometry.baseline_bytes(tokens) * compute_bytes // 2  # the baseline's bytes are 16-bit
    return geometry.baseline_bytes(tokens) + floats + 2 * full_layer + 2 * fed_tokens * vocab_size * 4


def available_bytes(device: torch.device) -> int:
    """Free memory where the caches live: GPU memory on CUDA, otherwise the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def batch_limit(per_member: int, free: int) -> int:
    """Members one batch may hold: :data:`MEMORY_SHARE` of ``free`` memory over each member's worst case."""
    return max(1, int(free * MEMORY_SHARE) // max(per_member, 1))
