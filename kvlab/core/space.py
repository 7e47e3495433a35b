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
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvlab.core.formats import FORMATS, QUANT_ALIASES
from kvlab.core.methods import METHOD_ALIASES, METHODS

#: Every alias of a format or a method -> its canonical name.
ALIASES: dict[str, str] = QUANT_ALIASES | METHOD_ALIASES
#: The Optuna parameter that holds a proposal's budget; the other parameters are "quant", "evict"
#: and the settings' field names ("group_size", "residual_length"), which stored studies depend on.
BUDGET_PARAM = "budget"
#: The Optuna parameter that holds a proposal's decode policy (:func:`decode_key`), asked only of a
#: method that scores during generation when the space offers policies.
DECODE_PARAM = "decode"

Point = dict[str, Any]


def decode_key(decode: Point | None) -> str:
    """A decode policy as an Optuna categorical value: ``"none"`` or its fields as sorted JSON."""
    return "none" if decode is None else json.dumps(decode, sort_keys=True)


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

    def varied(self, quant: str) -> list[str]:
        """The settings the space varies for format ``quant``: those it reads that the space offers."""
        return [s.field for s in FORMATS[quant].settings if s.field in self.settings]

    def size(self) -> int:
        """How many configs :meth:`points` lists, counted without listing them."""
        formats = sum(math.prod(len(self.settings[name]) for name in self.varied(quant)) for quant in self.quant)
        evictions = ("none" in self.evict) + sum(len(self.budgets) * len(self._decodes(method))
                                                  for method in self.evict if method != "none")
        baseline_left_out = not self.with_baseline and "none" in self.quant and "none" in self.evict
        return formats * evictions - baseline_left_out

    def points(self) -> Iterator[Point]:
        """Every config of the space, format by method, then by setting and budget."""
        for quant, method in itertools.product(self.quant, self.evict):
            evictions = [{}] if method == "none" else [self._eviction(method, value, decode)
                                                       for value in self.budgets for decode in self._decodes(method)]
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
                       for quant in self.quant if quant != "none"]
        if "none" in self.quant:
            middle = self.budgets[len(self.budgets) // 2]
            design += [{"quant": "none", "evict": method, BUDGET_PARAM: middle}
                       for method in self.evict if method != "none"]
        return design

    def suggest(self, trial: Trial) -> Point:
        """The config an Optuna trial proposes (the baseline when it names neither a format nor a method).

        The space is conditional, as Optuna's define-by-run API expresses it: a format's settings
        are asked only for a format that reads them, the budget only with a method.
        """
        quant = trial.suggest_categorical("quant", self.quant)
        point: Point = {"quant": quant} if quant != "none" else {}
        for name in self.varied(quant):
            point[name] = trial.suggest_categorical(name, self.settings[name])
        method = trial.suggest_categorical("evict", self.evict)
        if method != "none":
            decodes = {decode_key(d): d for d in self._decodes(method)}
            decode = decodes[trial.suggest_categorical(DECODE_PARAM, list(decodes))] if len(decodes) > 1 else None
            point |= self._eviction(method, self._suggest_budget(trial), decode)
        return point

    def _decodes(self, method: str) -> tuple[Point | None, ...]:
        return self.decode if METHODS[method].decodes else (None,)

    def _formats(self, quant: str) -> list[Point]:
        names = self.varied(quant)
        head: Point = {"quant": quant} if quant != "none" else {}
        return [head | dict(zip(names, values, strict=True))
                for values in itertools.product(*(self.settings[name] for name in names))]

    def _eviction(self, method: str, value: float, decode: Point | None = None) -> Point:
        return ({"evict": method, self.budget: value} | ({"query_aware": True} if self.query_aware else {})
                | ({"decode": dict(decode)} if decode is not None else {}))

    def _suggest_budget(self, trial: Trial) -> float:
        if len(self.budgets) == 1:
            return self.budgets[0]
        if self.budget_step is None:
            return trial.suggest_categorical(BUDGET_PARAM, self.budgets)
        return round(trial.suggest_float(BUDGET_PARAM, self.budgets[0], self.budgets[-1], step=self.budget_step), 6)
