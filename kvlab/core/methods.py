"""The eviction method registry: one declarative entry per token-eviction method, kvpress-style.

An entry names the kvpress press that scores tokens, which budgets it accepts (kinds of
:data:`BUDGETS`), what it needs from the prefill, and its own parameters (fields of
``KVCacheConfig`` with defaults and bounds in :data:`PARAMS`).  Config validation and its
messages, ``kvlab methods``, the CLI choices, the form's options and bounds, the blog-format
mapping and the server flags read from here; :mod:`kvlab.compress.eviction` builds the presses
from it.  Adding a method is one entry in :data:`METHODS` plus its line in
``tests/compress/test_every_method_on_passkey.py``.

Presses are named, not imported: this module stays free of torch so that validating a spec is
instant and the bottom layer (:mod:`kvlab.core`) imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Budget = str  # a budget kind's name: a key of BUDGETS and a KVCacheConfig field


@dataclass(frozen=True)
class BudgetKind:
    """One way to give an eviction method its budget: the ``KVCacheConfig`` field ``name``.

    Validation and its messages, ``describe()``'s labels (``snapkv:r0.5``), ``kvlab serve``'s flags,
    the form's columns, the blog-format mapping and ``kvlab methods`` read this registry.  Adding a
    kind is one entry in :data:`BUDGETS` plus its ``KVCacheConfig`` field (and the selection code in
    :mod:`kvlab.compress.eviction`).
    """

    name: str
    help: str
    title: str  # a table column's heading (the new-experiment form)
    label: str  # describe()'s prefix of the value: r0.5, top0.5, q0.5
    low: float  # the value lies strictly between low and high (both excluded)
    high: float
    fixes_count: bool  # it fixes how many tokens a head keeps (a threshold lets the scores decide)
    blog_keys: tuple[str, ...] = ()  # [kv_cache] keys of blog-style specs that translate to this budget
    integer: bool = False  # a count of tokens, not a fraction of the context


#: Fraction budgets lie strictly between these bounds (both excluded).
BUDGET_BOUNDS = (0.0, 1.0)
#: A token-count budget lies strictly below this (far above any context here).
MAX_KEEP_TOKENS = 1 << 20

BUDGETS: dict[str, BudgetKind] = {b.name: b for b in (
    BudgetKind("ratio", "fraction of context tokens removed (kvpress's compression_ratio)", "ratio (removed)",
               "r", *BUDGET_BOUNDS, fixes_count=True),
    BudgetKind("keep_fraction", "fraction of context tokens kept (top-k)", "keep fraction", "top", *BUDGET_BOUNDS,
               fixes_count=True, blog_keys=("sparse_top_k", "compression_ratio")),
    BudgetKind("threshold", "evict tokens whose normalised score is below this quantile of all the model's scores",
               "threshold (quantile)", "q", *BUDGET_BOUNDS, fixes_count=False, blog_keys=("eviction_threshold",)),
    BudgetKind("keep_tokens", "context tokens kept per head and layer, a count (attention sinks, the observation "
               "window and a query-aware question among them; never fewer than one context token)",
               "keep (tokens)", "n", 0, MAX_KEEP_TOKENS, fixes_count=True, integer=True),
)}

ALL_BUDGETS: tuple[Budget, ...] = tuple(BUDGETS)
#: Budgets that fix how many tokens a head keeps (a threshold lets the scores decide).
COUNT_BUDGETS: tuple[Budget, ...] = tuple(b.name for b in BUDGETS.values() if b.fixes_count)
#: Of those, the fractions of the context (what a [tune] searches, and what a budget-dependent scorer reads).
FRACTION_COUNT_BUDGETS: tuple[Budget, ...] = tuple(b for b in COUNT_BUDGETS if not BUDGETS[b].integer)


@dataclass(frozen=True)
class Param:
    """A method parameter: a ``KVCacheConfig`` field, shared by every method that uses it."""

    default: int
    low: int
    high: int
    help: str


PARAMS: dict[str, Param] = {
    "window_size": Param(64, 1, 1024, "queries of the observation window (SnapKV, PyramidKV)"),
    "n_sink": Param(4, 0, 1024, "first tokens always kept (attention sinks)"),
}


@dataclass(frozen=True)
class Method:
    """One eviction method.

    ``params`` maps the ``KVCacheConfig`` fields the method uses to its press's argument names.
    ``scorer``: the method whose prefill scores this one uses ("self" for its own, None for a
    positional method scored at selection time).  ``budget_dependent``: the press reads the
    budget while scoring, so each budget needs its own scorer and a threshold has no meaning.
    ``wraps``: the method whose press this press takes as its ``press`` argument.
    ``query_driven``: its scores come from query states, so a query-aware config (the question
    in the prefill) steers them.  ``replays_context``: scored after the prefill by having the model
    repeat the context (KVzip), its budget shared out across every layer and head by those scores.
    ``decode_refusal``: why the method cannot score the cache during generation (a decode policy,
    kvpress's ``DecodingPress``); empty where it can.  ``heads_refusal``: why its scores cannot be
    shared out across heads (:data:`HEAD_BUDGETS`); empty where they can.
    """

    name: str
    press: str  # kvpress class name
    description: str
    paper: str
    budgets: tuple[Budget, ...] = ALL_BUDGETS
    params: Mapping[str, str] = field(default_factory=dict)
    scorer: str | None = "self"
    needs_attention_weights: bool = False
    query_driven: bool = False
    budget_dependent: bool = False
    layer_budgets: bool = False  # the press sets per-layer budgets (get_layer_budget)
    seeded: bool = False  # the press takes kvlab's seed as ``seed``
    global_rng: bool = False  # the press draws from torch's global RNG: kvlab seeds it per layer
    wraps: str | None = None
    aliases: tuple[str, ...] = ()
    checked_on_default_model: bool = False  # covered by tests/compress/test_every_method_on_passkey.py
    decode_refusal: str = ""
    heads_refusal: str = ""
    replays_context: bool = False

    @property
    def decodes(self) -> bool:
        return not self.decode_refusal

    @property
    def headwise(self) -> bool:
        return not self.heads_refusal

    @property
    def scorer_method(self) -> str | None:
        return self.name if self.scorer == "self" else self.scorer


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("streaming_llm", "StreamingLLMPress", "attention sinks + recent window", "arXiv:2309.17453",
           budgets=COUNT_BUDGETS, params={"n_sink": "n_sink"}, scorer=None, aliases=("streamingllm", "streaming"),
           checked_on_default_model=True, heads_refusal="its scores are positions, the same for every head"),
    Method("snapkv", "SnapKVPress", "attention of the last window of queries", "arXiv:2404.14469",
           params={"window_size": "window_size"}, query_driven=True, checked_on_default_model=True),
    Method("tova", "TOVAPress", "attention of the last token", "arXiv:2401.06104", query_driven=True,
           checked_on_default_model=True, heads_refusal="its scores are averaged over heads, the same for every "
           "head"),
    Method("knorm", "KnormPress", "low key norm = important", "arXiv:2406.11430", checked_on_default_model=True),
    Method("observed_attention", "ObservedAttentionPress", "H2O: accumulated observed attention",
           "arXiv:2306.14048", needs_attention_weights=True, query_driven=True, aliases=("h2o",),
           checked_on_default_model=True, decode_refusal="it sums the prefill's full attention matrix, which a "
           "decoding step does not compute", heads_refusal="kvpress's head-wise presses refuse it (they need "
           "attention that is not eager, it needs the attention matrix)"),
    Method("expected_attention", "ExpectedAttentionPress", "expected attention of future queries", "kvpress",
           params={"n_sink": "n_sink"}, query_driven=True, aliases=("expected",), checked_on_default_model=True),
    Method("random", "RandomPress", "random eviction: a floor to compare against", "-", seeded=True,
           checked_on_default_model=True),
    Method("keydiff", "KeyDiffPress", "keys least similar to the mean key", "arXiv:2504.15364",
           checked_on_default_model=True),
    Method("pyramidkv", "PyramidKVPress", "SnapKV scores, budgets shrinking with depth", "arXiv:2406.02069",
           budgets=COUNT_BUDGETS, params={"window_size": "window_size"}, scorer="snapkv", layer_budgets=True,
           query_driven=True, checked_on_default_model=True,
           decode_refusal="its budgets are per layer, a decode policy keeps one token count",
           heads_refusal="its budgets are per layer; adakv shares a layer's budget out across heads"),
    Method("cur", "CURPress", "CurDKV: local leverage of keys x values", "arXiv:2509.15038",
           params={"n_sink": "num_sinks"}, checked_on_default_model=True),
    Method("lagkv", "LagKVPress", "LagKV: spread of keys/values relative to the next partition",
           "arXiv:2504.04704", params={"n_sink": "n_sink"}, checked_on_default_model=True),
    Method("leverage", "LeverageScorePress", "statistical leverage of pre-RoPE keys (sketched)",
           "arXiv:2507.08143", global_rng=True, checked_on_default_model=True,
           decode_refusal="kvpress scores it in the prefill only (its score refuses a decoding step)"),
    Method("non_causal_attention", "NonCausalAttnPress", "non-causal chunked attention x value norm",
           "arXiv:2507.08143", query_driven=True, checked_on_default_model=True,
           decode_refusal="kvpress scores it in the prefill only (its score refuses a decoding step)"),
    Method("compactor", "CompactorPress", "Compactor: leverage blended with non-causal attention",
           "arXiv:2507.08143", budgets=FRACTION_COUNT_BUDGETS, budget_dependent=True, global_rng=True,
           query_driven=True,
           checked_on_default_model=True, decode_refusal="its scores depend on the budget it is given",
           heads_refusal="its scores depend on the budget it is given"),
    Method("cap", "CapPress", "CAPKV: query-anchored capacity leverage of values", "arXiv:2604.25975",
           params={"n_sink": "n_sink"}, query_driven=True, checked_on_default_model=True),
    Method("criticalkv", "CriticalKVPress", "CriticalKV: SnapKV rescaled by |W_o v| in two stages",
           "arXiv:2502.03805", budgets=FRACTION_COUNT_BUDGETS, params={"window_size": "window_size"}, wraps="snapkv",
           budget_dependent=True, query_driven=True, checked_on_default_model=True,
           decode_refusal="its scores depend on the budget it is given",
           heads_refusal="its scores depend on the budget it is given; critical_adakv is its head-wise form "
           "(heads = 'critical_adakv' with evict = 'snapkv')"),
    Method("kvzip", "KVzipPress", "KVzip: attention each entry gets while the model repeats the context; one "
           "budget shared out across every layer and head", "arXiv:2505.23416", budgets=FRACTION_COUNT_BUDGETS,
           params={"n_sink": "n_sink"}, replays_context=True, checked_on_default_model=True,
           decode_refusal="it scores by having the model repeat the whole context, once, after the prefill",
           heads_refusal="its budget is already shared out across heads (and layers) by its scores"),
)}

@dataclass(frozen=True)
class HeadBudget:
    """How a layer's budget is shared out across its KV heads: one entry per kvpress head-wise press.

    ``press`` wraps the config's scorer (kvpress's ``AdaKVPress(press=...)``); ``uniform`` (None)
    keeps the same count in every head.  Head-wise caches hold each head's kept entries only
    (:class:`kvlab.compress.cache.HeadwiseLayer`), where kvpress keeps the full tensors and masks
    the evicted keys.
    """

    name: str
    press: str | None
    description: str
    paper: str
    label: str  # describe()'s suffix: snapkv:r0.5/ada


UNIFORM_HEADS = "uniform"
HEAD_BUDGETS: dict[str, HeadBudget] = {h.name: h for h in (
    HeadBudget(UNIFORM_HEADS, None, "every head of a layer keeps the same number of tokens", "-", ""),
    HeadBudget("adakv", "AdaKVPress", "AdaKV: a layer's budget goes to the best-scored tokens of all its heads, "
               "each head keeping at least alpha_safeguard of an equal share", "arXiv:2407.11550", "ada"),
    HeadBudget("critical_adakv", "CriticalAdaKVPress", "CriticalAdaKV: AdaKV's shares, then CriticalKV's two "
               "stages (|W_o v| rescaling) within each head", "arXiv:2502.03805", "cada"),
)}
HEAD_BUDGET_NAMES: tuple[str, ...] = tuple(HEAD_BUDGETS)
#: Budget kinds a head-wise share accepts (a threshold already lets the scores decide every count).
HEADWISE_BUDGETS: tuple[Budget, ...] = COUNT_BUDGETS
#: kvpress's default ``alpha_safeguard``.
DEFAULT_ALPHA_SAFEGUARD = 0.2

#: ScorerPress subclasses of the pinned kvpress that kvlab does not offer, and why.
REFUSED: dict[str, str] = {
    "QFilterPress": "needs Q-filter weights downloaded from the Hugging Face hub (nthngdy/<model>_qfilt); "
                    "kvlab runs offline",
    "KVzapPress": "needs a trained scorer downloaded from the Hugging Face hub (nvidia/KVzap-*); kvlab runs offline",
    "ExpectedAttentionStatsPress": "needs query statistics from the Hugging Face hub, or computes them on a "
                                   "hub dataset (kmfoda/booksum); kvlab runs offline (expected_attention "
                                   "estimates them from the prompt instead)",
}

METHOD_NAMES: tuple[str, ...] = ("none", *METHODS)
#: Every alias -> its canonical method name.
METHOD_ALIASES: dict[str, str] = {alias: m.name for m in METHODS.values() for alias in m.aliases}


def methods_that_decode() -> tuple[str, ...]:
    """Methods that may score the cache during generation (a decode policy)."""
    return tuple(name for name, m in METHODS.items() if m.decodes)


def methods_headwise() -> tuple[str, ...]:
    """Methods whose scores a head-wise budget (:data:`HEAD_BUDGETS`) may share out across heads."""
    return tuple(name for name, m in METHODS.items() if m.headwise)


def methods_with(budget: Budget) -> tuple[str, ...]:
    return tuple(name for name, m in METHODS.items() if budget in m.budgets)
