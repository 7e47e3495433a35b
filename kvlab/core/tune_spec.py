"""The ``[tune]`` table of a spec: the search space, the constraints and the budget of ``kvlab tune``.

The space is a grid -- formats x group sizes x residual lengths x eviction methods x budgets on
``budget_step`` -- which the sampler explores without enumerating it (budgets are drawn on their
step, so that "one grid step" and the equivalent full grid are well defined).  A candidate has a
group size and a residual length only with a format that reads them (the format registry's
``settings``), and a budget only with an eviction method: the space is conditional.
:meth:`TuneSpec.space` is that :class:`kvlab.core.space.ConfigSpace`, which also counts it
arithmetically: validation never builds the grid (:data:`kvlab.core.limits.TUNE_POINTS` bounds it).

Pure data and validation: nothing here imports torch or optuna (``kvlab show`` reads specs).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from kvlab.core.axis import grid_fields
from kvlab.core.backends import BACKENDS, launched_kinds
from kvlab.core.formats import FORMATS, QUANT_NAMES, SETTINGS
from kvlab.core.kv_config import GridAxes, KVCacheConfig, distinct
from kvlab.core.limits import TUNE_POINTS
from kvlab.core.methods import BUDGETS, FRACTION_COUNT_BUDGETS, METHOD_NAMES, METHODS
from kvlab.core.space import ConfigSpace

QuantName = Literal[QUANT_NAMES]  # type: ignore[valid-type]
MethodName = Literal[METHOD_NAMES]  # type: ignore[valid-type]
Sampler = Literal["tpe", "gp"]
#: The finest budget step: budgets are fractions kept to 6 decimals, and a finer grid only grows the
#: space (a step of 1e-9 once made validation build a billion candidates).
MIN_BUDGET_STEP = 0.001


#: The [tune] keys that list a format setting's values (``group_sizes``, ...), from the settings' axes.
TUNE_SETTINGS: tuple[str, ...] = tuple(key for s in SETTINGS.values() if (key := s.tune_key) is not None)

if TYPE_CHECKING:
    _TuneSettings = GridAxes
else:  # a list per format setting the tune searches, from the settings' axes
    _TuneSettings = create_model("_TuneSettings", __base__=GridAxes, __module__=__name__,
                                 **grid_fields(KVCacheConfig, "tune"))


class TuneSpec(_TuneSettings):
    """What ``kvlab tune`` searches, under which constraints, for how long.

    Objectives: physical KV bytes (minimise) and accuracy (maximise).  Constraints: accuracy
    non-inferior to the baseline at the spec's ``max_drop`` (the paired rule of
    :mod:`kvlab.analysis.decision`), and optionally the median TTFT / TPOT in milliseconds.
    Budget: the search stops at whichever of ``max_trials`` (candidates proposed),
    ``max_minutes`` and ``max_item_evals`` (item x config evaluations, the baseline's included)
    comes first.

    Rounds: each candidate first runs on ``min_items`` items; it gets ``eta`` times more items
    (up to all of them) while it stays among the most compressed ``1/eta`` of the plausibly
    non-inferior candidates judged on that many items.  One that is already clearly inferior, or
    bigger than a candidate already shown non-inferior on every item, stops.
    """

    quant: list[QuantName] = Field(default_factory=lambda: ["none", "int8", "int4", "int2"], min_length=1,
                                   description="Quantization formats the search may pick.")
    budget: Literal[FRACTION_COUNT_BUDGETS] = Field(  # type: ignore[valid-type]
        default="ratio", description="The budget kind of every eviction candidate (a fraction of the context).")
    budget_range: tuple[float, float] = Field(default=(0.25, 0.875), description="The lowest and highest budget, "
                                              "both included.")
    budget_step: Annotated[float, Field(ge=MIN_BUDGET_STEP, lt=1)] = Field(
        default=0.125, description="Budgets are drawn on this step from the range's low end.")
    sampler: Sampler = Field(default="tpe", description="Optuna's multi-objective TPE sampler, or gp (Gaussian "
                             "process).")
    candidates_per_round: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4, description="Candidates proposed per round; a round's candidates share each item's prefill.")
    min_items: Annotated[int, Field(ge=2, le=10_000)] = Field(default=4, description="Items each candidate first "
                                                              "runs on.")
    eta: Annotated[int, Field(ge=2, le=10)] = Field(
        default=3, description="A promoted candidate runs on eta times more items; the most compressed 1/eta of "
        "the plausibly non-inferior ones of a rung are promoted.")
    max_trials: Annotated[int, Field(ge=1, le=10_000)] | None = Field(
        default=40, description="Distinct candidates proposed at most.")
    max_minutes: Annotated[float, Field(gt=0)] | None = Field(default=None, description="Stop the search after "
                                                              "this many minutes.")
    max_item_evals: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Stop after this many item x config evaluations (the baseline's included).")
    max_ttft_ms: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Constraint: a candidate's median TTFT in milliseconds at most this.")
    max_tpot_ms: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Constraint: a candidate's median TPOT in milliseconds at most this.")

    @field_validator(*TUNE_SETTINGS)
    @classmethod
    def _distinct_settings(cls, values: list[Any]) -> list[Any]:
        return distinct(values)

    @property
    def budget_kind(self) -> str:
        return self.budget

    @model_validator(mode="after")
    def _check(self) -> TuneSpec:
        low, high = self.budget_range
        kind = BUDGETS[self.budget]
        if not kind.low < low <= high < kind.high:
            raise ValueError(f"budget_range = [{low}, {high}]: need {kind.low:g} < low <= high < {kind.high:g} "
                             f"({self.budget} is a fraction)")
        if self.max_trials is None and self.max_minutes is None and self.max_item_evals is None:
            raise ValueError("give the search a budget: max_trials, max_minutes or max_item_evals")
        for method in self.evict:
            if method != "none" and self.budget not in METHODS[method].budgets:
                raise ValueError(f"evict = {method!r} does not take budget = {self.budget!r} "
                                 f"(it takes {', '.join(METHODS[method].budgets)})")
        if self.query_aware and self.evict == ["none"]:
            raise ValueError("query_aware = true needs an eviction method in evict")
        points = grid_points(self)
        if not points:
            raise ValueError("the search space holds only the baseline (quant = ['none'], evict = ['none']): "
                             "add a format or an eviction method")
        TUNE_POINTS.check("", points, "the search space holds {n} candidates")
        return self

    def budget_count(self) -> int:
        """How many values :meth:`budgets` holds."""
        low, high = self.budget_range
        return math.floor((high - low) / self.budget_step + 1e-9) + 1

    def budgets(self) -> list[float]:
        """The budget values of the grid: ``budget_range`` on ``budget_step`` (ends included)."""
        low = self.budget_range[0]
        return [round(low + i * self.budget_step, 6) for i in range(self.budget_count())]

    def space(self) -> ConfigSpace:
        """The search space; the baseline is not one of its points (every tune runs it, as the reference)."""
        settings = {s.field: tuple(getattr(self, s.tune_key)) for s in SETTINGS.values() if s.tune_key is not None}
        return self.config_space(tuple(self.budgets()), settings, with_baseline=False, budget_step=self.budget_step)


def grid_points(tune: TuneSpec) -> int:
    """``len(candidate_grid(tune))``, counted without building the grid."""
    return tune.space().size()


def candidate_grid(tune: TuneSpec) -> list[dict[str, Any]]:
    """Every point of the space as ``KVCacheConfig`` fields, the baseline excluded (it always runs)."""
    return list(tune.space().points())


def backend_space(tune: TuneSpec, backend_kind: str) -> tuple[TuneSpec, list[str]]:
    """The part of the space ``backend_kind`` can run, and a note per thing left out.

    The embedded engine and ``kvlab serve`` run every format of kvlab's cache and every method.  A launched server
    has only its KV dtypes (its registry entry's ``kv_dtypes``; value formats of their own where it stores keys and
    values apart: llama.cpp) and no token eviction; an OpenAI-compatible endpoint has no KV setting a client can
    choose, so there is nothing to tune there.
    """
    backend = BACKENDS[backend_kind]
    if backend.kv_choice == "none":
        raise ValueError("an OpenAI-compatible endpoint decides its own KV cache: there is nothing kvlab can tune "
                         f"through it; tune with backend kind 'embedded' (or {launched_kinds()}, which kvlab launches "
                         "with its KV cache types)")
    if backend.kv_choice == "all":
        runs = {name for name, fmt in FORMATS.items() if fmt.kvlab_stores}
        values = [v for v in tune.value_quant if v in runs]
    else:
        runs = set(backend.kv_dtypes)
        values = [v for v in tune.value_quant if v in runs] if backend.separate_kv else []
    notes = []
    if backend.kv_choice == "all":  # kvlab's own cache: unrotated unless rotation = true
        rotation: list[bool] = [r for r in tune.rotation if r]
        if False in tune.rotation:
            notes.append(f"{backend_kind} stores its formats unrotated unless rotation = true: rotation = false "
                         "left out of the search")
    else:
        rotation = tune.rotation if backend.rotates else []
        if tune.rotation and not backend.rotates:
            notes.append(f"{backend_kind} has no rotation setting: rotation = {tune.rotation} left out of the search")
    formats = [q for q in tune.quant if q in runs]
    if dropped := [q for q in tune.quant if q not in formats]:
        notes.append(f"{backend_kind} has no KV cache like {', '.join(dropped)}: left out of the search")
    if dropped_values := [v for v in tune.value_quant if v not in values]:
        why = "" if backend.separate_kv or backend.kv_choice == "all" else " (one dtype holds keys and values)"
        notes.append(f"{backend_kind} stores no values in {', '.join(dropped_values)}{why}: left out of the search")
    if backend.kv_choice == "all":
        if not formats:
            raise ValueError(f"nothing left to tune on {backend_kind}: put one of {', '.join(sorted(runs))} in "
                             "[tune] quant")
        return ((tune.model_copy(update={"quant": formats, "value_quant": values, "rotation": rotation}), notes)
                if notes else (tune, []))
    methods = [m for m in tune.evict if m != "none"]
    if methods:
        notes.append(f"{backend_kind} evicts no tokens: {', '.join(methods)} left out of the search")
    if not [q for q in formats if q != "none"] and not values:
        raise ValueError(f"nothing left to tune on {backend_kind}: its KV dtypes are "
                         f"{', '.join(backend.kv_dtypes)}; "
                         "put one of them in [tune] quant")
    # The engine's own KV dtype has neither kvlab's block size nor its residual window: one value each.
    defaults = {s.tune_key: [s.default] for s in SETTINGS.values() if s.tune_key is not None}
    narrowed = tune.model_copy(update={"quant": formats, "value_quant": values, "evict": ["none"], "rotation": rotation,
                                       "query_aware": False} | defaults)
    return narrowed, notes


def rungs(n_items: int, min_items: int, eta: int) -> list[int]:
    """Item counts of the rungs, ascending: ``n_items``, divided by ``eta`` while above ``min_items``,
    the smallest being ``min_items``; a rung under 1.5x the one below it is dropped (it would
    decide nothing new)."""
    floor = min(min_items, n_items)
    sizes = [n_items]
    while sizes[-1] > floor:
        sizes.append(max(math.ceil(sizes[-1] / eta), floor))
    sizes.reverse()
    kept = [sizes[0]]
    for size in sizes[1:]:
        if size >= 1.5 * kept[-1] or size == n_items:
            if size == n_items and len(kept) > 1 and size < 1.5 * kept[-1]:
                kept.pop()
            kept.append(size)
    return kept


def grid_size(tune: TuneSpec, backend_kind: str, n_items: int) -> tuple[int, int]:
    """(points, item evaluations) of the full grid equivalent to ``tune`` on ``backend_kind``: every
    candidate and the baseline on every one of ``n_items`` items."""
    points = grid_points(backend_space(tune, backend_kind)[0])
    return points, (points + 1) * n_items
