"""The space of KV-cache configs that a ``[sweep]`` expands and a ``[tune]`` searches: one walker for both.

A point of the space is a format, the values of the settings that format reads (its
``settings`` in :data:`kvlab.core.formats.FORMATS`: a format that does not read a setting
is never given one), an eviction method and, with a method, a budget.  :class:`ConfigSpace`
lists the points (:meth:`~ConfigSpace.points`), counts them arithmetically
(:meth:`~ConfigSpace.size`: validation bounds a space without building it), and proposes them
to an Optuna study (:meth:`~ConfigSpace.initial_design`, :meth:`~ConfigSpace.suggest`), so a
sweep and a tune of the same values hold the same configs.

A point is a dict of ``KVCacheConfig`` fields; the fields it leaves out keep their defaults (the
baseline is ``{}``).  Pure data: nothing here imports torch, optuna or :mod:`kvlab.core.kv_config`
(which builds spaces from its specs).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvlab.core.axis import choice_key
from kvlab.core.formats import QUANT_ALIASES, format_settings
from kvlab.core.methods import HEADWISE_BUDGETS, METHOD_ALIASES, METHODS, UNIFORM_HEADS

#: Every alias of a format or a method -> its canonical name.
ALIASES: dict[str, str] = QUANT_ALIASES | METHOD_ALIASES
#: The Optuna parameter that holds a proposal's budget; the other parameters are "quant", "evict"
#: and the settings' field names ("group_size", "residual_length"), which stored studies depend on.
BUDGET_PARAM = "budget"
#: The Optuna parameter that holds a proposal's decode policy (:func:`choice_key`), asked only of a
#: method that scores during generation when the space offers policies.
DECODE_PARAM = "decode"
#: The Optuna parameter that holds a proposal's head budget (``KVCacheConfig.heads``), asked only of a
#: method whose scores may be shared out across heads when the space offers more than one.
HEADS_PARAM = "heads"
#: The Optuna parameter of a proposal's value format, one per key format (``value_quant:int8``: the
#: formats offered exclude the key's own, so each key format has its own choices), "same" for none.
VALUE_PARAM = "value_quant"
SAME_FORMAT = "same"

Point = dict[str, Any]


def canonical_name(value: Any) -> Any:
    """A format or method name as kvlab spells it (case, dashes and aliases such as ``FP8`` or ``h2o``
    forgiven); anything that is not a string is returned as it is, for validation to refuse."""
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        return ALIASES.get(key, key)
    return value


def canonical_names(value: Any) -> Any:
    """:func:`canonical_name` of each entry of a list (anything else is returned as it is)."""
    return [canonical_name(v) for v in value] if isinstance(value, list) else value


class Trial(Protocol):
    """The part of ``optuna.Trial`` that :meth:`ConfigSpace.suggest` uses."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None) -> float: ...


@dataclass(frozen=True)
class ConfigSpace:
    """Formats x their settings x eviction methods x budgets.

    ``settings`` offers values per setting (``{"group_size": (32, 128)}``); each format takes the
    offered settings it reads, a setting not offered keeps its default.  Every method takes the
    budget kind ``budget`` at each of ``budgets``; they lie on ``budget_step`` when one is given
    (a trial then draws the budget as a float on that step, otherwise it picks one of them).
    ``with_baseline``: whether the point of no format and no method is in the space (a sweep runs
    it as one of its configs; a tune runs it apart, as the reference).  Each tuple holds distinct
    values, so that the points are distinct and :meth:`size` counts them.
    """

    quant: tuple[str, ...]
    evict: tuple[str, ...]
    budget: str
    budgets: tuple[float, ...]
    settings: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    budget_step: float | None = None
    query_aware: bool = False
    with_baseline: bool = True
    #: Decode policies (``KVCacheConfig.decode`` dicts; None: none) each budget of a method that scores
    #: during generation is tried with; the other methods keep none.
    decode: tuple[Point | None, ...] = (None,)
    #: Head budgets (``KVCacheConfig.heads``) each budget of a method whose scores may be shared out
    #: across heads is tried with (without a decode policy: a head-wise cache is not cut while decoding);
    #: the other methods keep uniform heads.
    heads: tuple[str, ...] = (UNIFORM_HEADS,)
    #: Value formats (``KVCacheConfig.value_quant``) each format of ``quant`` is also tried with for
    #: its values (its keys in its own format); a format is never offered as its own value format.
    value_quant: tuple[str, ...] = ()
    #: Values each point that quantizes is also tried with, by ``KVCacheConfig`` field: the ``also`` axes
    #: (:mod:`kvlab.core.axis`: 16-bit layer patterns as dicts, rotation settings), in the config's field order.
    #: An Optuna trial asks each under its field's name, its values as :func:`~kvlab.core.axis.choice_key`.
    also: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def varied(self, quant: str, value: str | None = None) -> list[str]:
        """The settings the space varies for keys in ``quant`` and values in ``value`` (None: the same):
        those the formats read that the space offers."""
        return [s.field for s in format_settings(quant, value or quant) if s.field in self.settings]

    def _values(self, quant: str) -> tuple[str | None, ...]:
        return (None, *(v for v in self.value_quant if v != quant))

    def _also(self, quant: str, value: str | None) -> dict[str, tuple[Any, ...]]:
        """Each ``also`` axis's options (unset first) for keys in ``quant`` and values in ``value``: none where
        nothing is quantized."""
        return {name: (None, *values) for name, values in self.also.items()} if _quantizes(quant, value) else {}

    def size(self) -> int:
        """How many configs :meth:`points` lists, counted without listing them."""
        formats = sum(math.prod(len(self.settings[name]) for name in self.varied(quant, value))
                      * math.prod(len(options) for options in self._also(quant, value).values())
                      for quant in self.quant for value in self._values(quant))
        evictions = ("none" in self.evict) + sum(len(self.budgets) * len(self._variants(method))
                                                  for method in self.evict if method != "none")
        baseline_left_out = not self.with_baseline and "none" in self.quant and "none" in self.evict
        return formats * evictions - baseline_left_out

    def points(self) -> Iterator[Point]:
        """Every config of the space, format by method, then by setting and budget."""
        for quant, method in itertools.product(self.quant, self.evict):
            evictions = [{}] if method == "none" else [self._eviction(method, value, decode, heads)
                                                       for value in self.budgets
                                                       for decode, heads in self._variants(method)]
            for fmt in self._formats(quant):
                for eviction in evictions:
                    if fmt or eviction or self.with_baseline:
                        yield fmt | eviction

    def initial_design(self) -> list[dict[str, Any]]:
        """The first proposals, as Optuna parameters: each format alone (at the first value of each
        setting), then each method alone at its middle budget.

        The sampler then starts from the axes of the space -- what quantization alone and eviction
        alone cost -- instead of a few random combinations (a seeded TPE's first five draws on a
        4 formats x 2 methods space were all quantization *and* eviction).
        """
        design: list[dict[str, Any]] = []
        if "none" in self.evict:
            design += [{"quant": quant, "evict": "none"} | {name: self.settings[name][0] for name in self.varied(quant)}
                       | self._plain(quant, "none") for quant in self.quant if quant != "none"]
        if "none" in self.quant:
            middle = self.budgets[len(self.budgets) // 2]
            design += [{"quant": "none", "evict": method, BUDGET_PARAM: middle} | self._plain("none", method)
                       for method in self.evict if method != "none"]
        return design

    def _plain(self, quant: str, method: str) -> dict[str, Any]:
        """The plain answers (values as keys, no 16-bit layers, uniform heads, no decode policy) to the
        conditional questions :meth:`suggest` asks of ``quant`` and ``method`` in this space."""
        params: dict[str, Any] = {}
        if len(self._values(quant)) > 1:
            params[f"{VALUE_PARAM}:{quant}"] = SAME_FORMAT
        params |= {name: choice_key(None) for name in self._also(quant, None)}
        if method != "none":
            heads = self._heads(method)
            if len(heads) > 1:
                params[HEADS_PARAM] = UNIFORM_HEADS if UNIFORM_HEADS in heads else heads[0]
            if params.get(HEADS_PARAM, heads[0]) == UNIFORM_HEADS and len(self._decodes(method)) > 1:
                params[DECODE_PARAM] = choice_key(None)
        return params

    def suggest(self, trial: Trial) -> Point:
        """The config an Optuna trial proposes (the baseline when it names neither a format nor a method).

        The space is conditional, as Optuna's define-by-run API expresses it: a format's settings
        are asked only for a format that reads them, the budget only with a method.
        """
        quant = trial.suggest_categorical("quant", self.quant)
        point: Point = {"quant": quant} if quant != "none" else {}
        values = self._values(quant)
        value = None
        if len(values) > 1:
            chosen = trial.suggest_categorical(f"{VALUE_PARAM}:{quant}", [v or SAME_FORMAT for v in values])
            value = None if chosen == SAME_FORMAT else chosen
        point |= {"value_quant": value} if value is not None else {}
        for name in self.varied(quant, value):
            point[name] = trial.suggest_categorical(name, self.settings[name])
        for name, options in self._also(quant, value).items():
            keyed = {choice_key(option): option for option in options}
            if (chosen := keyed[trial.suggest_categorical(name, list(keyed))]) is not None:
                point[name] = _own(chosen)
        method = trial.suggest_categorical("evict", self.evict)
        if method != "none":
            offered = self._heads(method)
            heads = trial.suggest_categorical(HEADS_PARAM, offered) if len(offered) > 1 else offered[0]
            decodes = {choice_key(d): d for d in self._decodes(method)} if heads == UNIFORM_HEADS else {}
            decode = decodes[trial.suggest_categorical(DECODE_PARAM, list(decodes))] if len(decodes) > 1 else None
            point |= self._eviction(method, self._suggest_budget(trial), decode, heads)
        return point

    def _decodes(self, method: str) -> tuple[Point | None, ...]:
        return self.decode if METHODS[method].decodes else (None,)

    def _heads(self, method: str) -> tuple[str, ...]:
        return self.heads if METHODS[method].headwise and self.budget in HEADWISE_BUDGETS else (UNIFORM_HEADS,)

    def _variants(self, method: str) -> list[tuple[Point | None, str]]:
        """A method's (decode policy, head budget) pairs: each policy with uniform heads, each head-wise
        budget without a policy."""
        heads = self._heads(method)
        return [(decode, UNIFORM_HEADS) for decode in self._decodes(method) if UNIFORM_HEADS in heads] + \
            [(None, h) for h in heads if h != UNIFORM_HEADS]

    def _formats(self, quant: str) -> list[Point]:
        """Keys in ``quant``: values in the same format or another offered, with each value of an ``also``
        axis offered where it quantizes, by the settings the formats read."""
        points = []
        for value in self._values(quant):
            names = self.varied(quant, value)
            head: Point = ({"quant": quant} if quant != "none" else {}) | (
                {"value_quant": value} if value is not None else {})
            also = self._also(quant, value)
            for chosen in itertools.product(*also.values()):
                tail: Point = {name: _own(option) for name, option in zip(also, chosen, strict=True)
                               if option is not None}
                points += [head | dict(zip(names, values, strict=True)) | tail
                           for values in itertools.product(*(self.settings[name] for name in names))]
        return points

    def _eviction(self, method: str, value: float, decode: Point | None = None, heads: str = UNIFORM_HEADS) -> Point:
        return ({"evict": method, self.budget: value} | ({"query_aware": True} if self.query_aware else {})
                | ({"decode": dict(decode)} if decode is not None else {})
                | ({"heads": heads} if heads != UNIFORM_HEADS else {}))

    def _suggest_budget(self, trial: Trial) -> float:
        if len(self.budgets) == 1:
            return self.budgets[0]
        if self.budget_step is None:
            return trial.suggest_categorical(BUDGET_PARAM, self.budgets)
        return round(trial.suggest_float(BUDGET_PARAM, self.budgets[0], self.budgets[-1], step=self.budget_step), 6)


def _own(option: Any) -> Any:
    """An option as a point holds it: a nested table copied, so that no two points share one dict."""
    return dict(option) if isinstance(option, Mapping) else option


def _quantizes(quant: str, value: str | None) -> bool:
    """Whether keys in ``quant`` and values in ``value`` (None: the same) quantize anything."""
    return quant != "none" or (value or quant) != "none"
