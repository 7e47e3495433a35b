"""The config space of sweeps and tunes (kvlab.core.space), the formats' settings and the budget registry.

A space's count, its points, its proposals and its initial design must agree; what each format
declares it reads must be what the byte accounting reads; and the budget kinds are spelled once.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import pytest

from kvlab.compress.accounting import analytic_layer_bytes
from kvlab.core.formats import FORMATS, GROUP_SIZES, KEY_AXES, KVLAB_QUANT_NAMES, SETTINGS
from kvlab.core.kv_config import KVCacheConfig, SweepGrid, describe
from kvlab.core.methods import BUDGETS, COUNT_BUDGETS, FRACTION_COUNT_BUDGETS, HEAD_BUDGET_NAMES, METHODS, methods_with
from kvlab.core.space import (
    BUDGET_PARAM,
    DECODE_PARAM,
    HEADS_PARAM,
    VALUE_PARAM,
    ConfigSpace,
    canonical_name,
)
from kvlab.core.tune_spec import TuneSpec, backend_space
from kvlab.spec_files import parse_spec_toml

ROOT = Path(__file__).resolve().parents[2]

SWEEPS = [
    {"quant": ["int8"]},
    {"quant": ["none", "int4", "fp8_e4m3"], "evict": ["none", "snapkv", "knorm"], "ratios": [0.25, 0.5, 0.75]},
    {"evict": ["snapkv", "tova"], "ratios": [0.5]},
    {"quant": ["int2", "fp8_e5m2"], "evict": ["none"], "group_size": 32, "residual_length": 0},
    {"quant": ["none", "fp8_e4m3"], "evict": ["none", "streaming_llm"], "query_aware": True},
    {"quant": ["none", "q4_0", "q4_1", "iq4_nl", "q8_0"], "rotation": [False]},  # llama.cpp's rotation on and off
]
TUNES = [
    {},
    {"quant": ["none"], "evict": ["none", "snapkv"]},
    {"quant": ["int8", "fp8_e4m3"], "evict": ["none"], "group_sizes": [32, 64, 128], "residual_lengths": [0, 64]},
    {"quant": ["none", "int4", "int2"], "evict": ["snapkv", "knorm"], "budget_range": [0.1, 0.9],
     "budget_step": 0.1, "query_aware": True},
    {"quant": ["none", "int8"], "evict": ["none", "snapkv"], "budget_range": [0.5, 0.5]},
    {"quant": ["none", "fp8_e5m2", "int4"], "group_sizes": [128, 32], "residual_lengths": [16, 0],
     "evict": ["none", "streaming_llm", "cur"], "budget": "keep_fraction"},
    {"quant": ["q4_0", "q8_0"], "value_quant": ["q4_0"], "rotation": [True, False]},
]


def random_tune(rng: random.Random) -> TuneSpec:
    """A valid tune space of random formats, settings, methods and budgets."""
    budget = rng.choice(FRACTION_COUNT_BUDGETS)  # a tune searches fractions of the context
    quant = rng.sample(list(FORMATS), rng.randint(1, 4))
    evict = rng.sample(["none", *methods_with(budget)], rng.randint(1, 3))
    if quant == ["none"] and evict == ["none"]:
        evict.append(methods_with(budget)[0])
    low = rng.choice([0.1, 0.25, 0.5])
    methods = [METHODS[m] for m in evict if m != "none"]
    heads = ["uniform", *rng.sample(HEAD_BUDGET_NAMES[1:], rng.randint(0, 2))] if any(m.headwise for m in methods) \
        else ["uniform"]
    value_quant = rng.sample(list(FORMATS), rng.randint(0, 2))
    quantizes = any(f != "none" for f in (*quant, *value_quant))
    return TuneSpec(quant=quant, evict=evict, budget=budget, group_sizes=rng.sample(GROUP_SIZES, rng.randint(1, 3)),
                    residual_lengths=rng.sample([0, 16, 64, 128], rng.randint(1, 3)),
                    budget_range=(low, rng.choice([low, 0.75, 0.875])), budget_step=rng.choice([0.125, 0.25]),
                    query_aware=rng.random() < 0.3 and bool(methods) and not any(m.replays_context for m in methods),
                    heads=heads, value_quant=value_quant,
                    skip_layers=[{"first": 1, "last": 2}] if quantizes and rng.random() < 0.3 else [],
                    rotation=rng.sample([True, False], rng.randint(1, 2)) if quantizes and rng.random() < 0.3 else [])


def spec_spaces() -> list[ConfigSpace]:
    rng = random.Random(20)
    spaces = [SweepGrid(**grid).space() for grid in SWEEPS]
    spaces += [TuneSpec(**tune).space() for tune in TUNES]
    return spaces + [random_tune(rng).space() for _ in range(40)]


SPEC_SPACES = spec_spaces()
#: And a space that offers a setting no spec offers (key_axis): the formats that read it vary it, the others do not.
SPACES = [*SPEC_SPACES, ConfigSpace(quant=tuple(FORMATS), evict=("none", "tova"), budget="threshold",
                                    budgets=(0.2, 0.4), settings={"key_axis": KEY_AXES, "group_size": (32, 64)},
                                    with_baseline=False)]


class RandomTrial:
    """An Optuna-trial stand-in that draws each parameter at random (categorical, or a float on its step)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.params[name] = self.rng.choice(list(choices))
        return self.params[name]

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None) -> float:
        assert step is not None
        self.params[name] = low + self.rng.randint(0, round((high - low) / step)) * step
        return self.params[name]


class ReplayTrial:
    """A trial whose parameters are given (as Optuna replays an enqueued trial): each must be a valid draw."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        assert self.params[name] in tuple(choices), (name, self.params[name], choices)
        return self.params[name]

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None) -> float:
        value = self.params[name]
        assert low <= value <= high and (step is None or abs((value - low) / step - round((value - low) / step)) < 1e-9)
        return value


def configs(points: Any) -> list[KVCacheConfig]:
    return [KVCacheConfig(**point) for point in points]


# -- the space -------------------------------------------------------------------------------------

@pytest.mark.parametrize("space", SPACES)
def test_size_counts_the_distinct_points(space):
    points = configs(space.points())
    assert space.size() == len(points) == len(set(points))
    assert any(p.is_baseline for p in points) == (space.with_baseline and "none" in space.quant
                                                  and "none" in space.evict)


@pytest.mark.parametrize("space", SPACES)
def test_suggestions_and_the_initial_design_are_points(space):
    points = set(configs(space.points()))
    rng = random.Random(7)
    for _ in range(60):
        config = KVCacheConfig(**space.suggest(RandomTrial(rng)))
        assert config in points or (config.is_baseline and not space.with_baseline)
    for params in space.initial_design():
        config = KVCacheConfig(**space.suggest(ReplayTrial(params)))
        assert config in points and not config.is_baseline
        # the study's parameter names (the conditional ones answered plainly: the format or the method alone)
        assert set(params) <= {"quant", "evict", BUDGET_PARAM, *space.settings, HEADS_PARAM, DECODE_PARAM, *space.also,
                               *(f"{VALUE_PARAM}:{quant}" for quant in space.quant)}
        assert config.value_quant is None and config.skip_layers is None and config.decode is None
        assert config.rotation is None  # the engine's default first
        assert config.heads == "uniform" or "uniform" not in space.heads


@pytest.mark.parametrize("space", SPEC_SPACES)
def test_labels_tell_the_points_apart(space):
    """A tune takes a proposal with a label it has seen for a repeat: every point of a sweep or a tune needs
    its own label."""
    labels = [c.label for c in configs(space.points())]
    assert len(labels) == len(set(labels))


def test_configs_that_differ_only_in_the_key_axis_have_their_own_labels():
    """KIVI's per-channel keys are the default and go unsaid; per-token keys are said."""
    channel, token = KVCacheConfig(quant="int4"), KVCacheConfig(quant="int4", key_axis="token")
    assert (channel.label, token.label) == ("int4/g64/r64", "int4/g64/r64/key-token")
    assert KVCacheConfig(quant="fp8_e4m3", key_axis="token").label == "fp8_e4m3"  # fp8 reads no key axis


def test_a_format_takes_the_settings_it_reads_and_keeps_the_defaults_of_the_others():
    space = SweepGrid(quant=["none", "int4", "fp8_e4m3"], evict=["none", "snapkv"], group_size=32,
                      residual_length=0).space()
    by_label = {c.label: c for c in configs(space.points())}
    assert by_label["int4/g32"].group_size == 32 and by_label["int4/g32"].residual_length == 0
    assert by_label["fp8_e4m3/g32/r0"].group_size == 32  # fp8's blocks of group_size tokens, its 16-bit residual
    assert by_label["snapkv:r0.5"] == KVCacheConfig(evict="snapkv", ratio=0.5)  # no format: nothing to set
    assert by_label["baseline"] == KVCacheConfig()


def test_a_sweep_and_a_tune_of_the_same_values_hold_the_same_configs():
    quant, evict = ["none", "int8", "fp8_e5m2"], ["none", "snapkv"]
    sweep = SweepGrid(quant=quant, evict=evict, ratios=[0.25, 0.5], group_size=128, residual_length=16)
    tune = TuneSpec(quant=quant, evict=evict, group_sizes=[128], residual_lengths=[16], budget_range=(0.25, 0.5),
                    budget_step=0.25)
    assert set(configs(tune.space().points())) == {c for c in sweep.expand() if not c.is_baseline}


def test_canonical_names_in_one_place():
    assert canonical_name(" Int4 ") == "int4" and canonical_name("FP8-E5M2") == "fp8_e5m2"
    assert canonical_name("H2O") == "observed_attention" and canonical_name(3) == 3
    assert SweepGrid(quant=["FP8"], evict=["h2o"]).quant == TuneSpec(quant=["FP8"], evict=["h2o"]).quant
    assert TuneSpec(evict=["H2O"]).evict == ["observed_attention"]


def test_rotation_is_an_axis_of_the_servers_that_rotate_and_of_no_other():
    grid = SweepGrid(quant=["none", "q4_0", "q8_0"], rotation=[False])
    assert [c.label for c in grid.expand()] == ["baseline", "q4_0", "q4_0/norot", "q8_0", "q8_0/norot"]
    with pytest.raises(ValueError, match="rotation applies to quantized keys or values"):
        SweepGrid(quant=["none"], evict=["snapkv"], rotation=[False])
    with pytest.raises(ValueError, match="rotation lists false twice"):
        SweepGrid(quant=["q4_0"], rotation=[False, False])
    tune = TuneSpec(quant=["q4_0", "int4"], rotation=[False])
    on_llamacpp, notes = backend_space(tune, "llamacpp")
    assert on_llamacpp.rotation == [False] and on_llamacpp.space().size() == 2 and notes == [
        "llamacpp has no KV cache like int4: left out of the search"]
    on_embedded, notes = backend_space(tune, "embedded")
    assert on_embedded.rotation == [] and notes[0] == (
        "embedded stores its formats unrotated unless rotation = true: rotation = false left out of the search")
    on_vllm, notes = backend_space(TuneSpec(quant=["fp8_e4m3"], rotation=[True]), "vllm")
    assert on_vllm.rotation == [] and notes == [
        "vllm has no rotation setting: rotation = [True] left out of the search"]
    rotated = backend_space(TuneSpec(quant=["int4"], rotation=[True]), "embedded")[0]  # kvlab's own rotation
    assert [c.label for c in configs(rotated.space().points())] == ["int4/g64/r64", "int4/g64/r64/rot"]


def test_a_launched_server_tunes_only_its_dtypes_at_the_default_settings():
    narrowed, _ = backend_space(TuneSpec(quant=["none", "int4", "fp8_e4m3"], group_sizes=[32, 128],
                                         residual_lengths=[0, 16], evict=["none", "snapkv"]), "vllm")
    assert configs(narrowed.space().points()) == [KVCacheConfig(quant="fp8_e4m3")]


# -- what each format reads ------------------------------------------------------------------------

SETTING_VALUES = {"group_size": GROUP_SIZES, "residual_length": (0, 16, 64, 200), "key_axis": KEY_AXES}


@pytest.mark.parametrize("fmt", KVLAB_QUANT_NAMES)  # a ggml format is a llama.cpp server's to store
def test_a_format_declares_exactly_the_settings_its_bytes_depend_on(fmt):
    """The byte accounting (what is measured) reads a setting for a format iff the format declares it."""
    assert set(SETTING_VALUES) == set(SETTINGS)
    declared = {s.field for s in FORMATS[fmt].settings}
    for name, values in SETTING_VALUES.items():
        # group size 128 over 64 channels: per-channel and per-token key groups differ in number
        sizes = {analytic_layer_bytes(KVCacheConfig(quant=fmt, **({"group_size": 128} | {name: value})), 2, 64, 1000)
                 for value in values}
        assert (len(sizes) > 1) == (name in declared), (fmt, name, sizes)


def test_settings_defaults_are_the_configs():
    for setting in SETTINGS.values():
        assert KVCacheConfig.model_fields[setting.field].default == setting.default
    for fmt in FORMATS.values():
        assert all(s.choices == SETTINGS[s.field].choices for s in fmt.settings)


def test_fp8_labels_keep_their_old_spelling_at_the_defaults():
    assert describe(KVCacheConfig(quant="fp8_e4m3")) == "fp8_e4m3"
    assert describe(KVCacheConfig(quant="fp8_e5m2", group_size=32, residual_length=0)) == "fp8_e5m2/g32/r0"
    assert describe(KVCacheConfig(quant="int4", residual_length=0)) == "int4/g64"


# -- the budget registry ---------------------------------------------------------------------------

def test_each_budget_kind_is_a_config_field_with_its_bounds():
    for kind in BUDGETS.values():
        field = KVCacheConfig.model_fields[kind.name]
        assert field.default is None
        inside = (kind.low + kind.high) // 2 if kind.integer else (kind.low + kind.high) / 2
        assert getattr(KVCacheConfig(evict="knorm", **{kind.name: inside}), kind.name) == inside
        for edge in (kind.low, kind.high):
            with pytest.raises(ValueError):
                KVCacheConfig(evict="knorm", **{kind.name: edge})
        value = 64 if kind.integer else 0.5
        assert KVCacheConfig(evict="knorm", **{kind.name: value}).label == f"knorm:{kind.label}{value:g}"
    assert set(COUNT_BUDGETS) == {k.name for k in BUDGETS.values() if k.fixes_count}
    assert all(set(m.budgets) <= set(BUDGETS) for m in METHODS.values())


def test_every_blog_budget_key_becomes_its_kind():
    for kind in BUDGETS.values():
        for key in kind.blog_keys:
            value = 8 if key == "compression_ratio" else 0.5  # a target ratio, translated to a fraction kept
            spec, _ = parse_spec_toml(f"[kv_cache]\n{key} = {value}\neviction_method = 'knorm'\n")
            assert list(spec.configs[0].budgets_given) == [kind.name], key


def _budget_lists(source: str) -> list[int]:
    """Lines of Python ``source`` where a tuple, list, set or dict spells two budget kinds or more by hand."""
    displays = ast.Tuple | ast.List | ast.Set | ast.Dict

    def entries(node: Any) -> list[Any]:
        return [*node.keys, *node.values] if isinstance(node, ast.Dict) else list(node.elts)

    def names(node: Any) -> set[str]:
        """The budget kinds among a display's entries, and among those of displays directly in it."""
        found = set()
        for entry in entries(node):
            inner = entries(entry) if isinstance(entry, displays) else [entry]
            found |= {e.value for e in inner if isinstance(e, ast.Constant) and e.value in BUDGETS}
        return found

    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, displays) and len(names(node)) >= 2})


def test_the_budget_registry_is_the_only_list_of_budget_kinds():
    registry = ROOT / "kvlab" / "core" / "methods.py"
    assert registry.is_file()
    spelled = {f"{path.relative_to(ROOT)}:{line}" for path in sorted((ROOT / "kvlab").rglob("*.py"))
               if path != registry for line in _budget_lists(path.read_text(encoding="utf-8"))}
    assert not spelled, f"budget kinds listed by hand (read kvlab.core.methods.BUDGETS): {sorted(spelled)}"
    # the check finds the spellings it replaced, and leaves one kind named on its own alone
    assert _budget_lists('FLAGS = ("quant", "ratio", "keep_fraction")\nfor b in ["ratio", "threshold"]: pass') == [1, 2]
    assert _budget_lists('LABELS = {"ratio": "ratio (removed)", "keep_fraction": "keep fraction"}') == [1]
    assert _budget_lists('SEED = {"a": "threshold", "b": "keep_fraction"}\n'
                         'pairs = (("ratio", 1), ("threshold", 2))') == [1, 2]
    assert _budget_lists('grid = SweepGrid(ratios=[0.5])\nconfig.get("ratio")') == []


def test_kinds_of_the_registry_flow_to_every_consumer():
    from kvlab.core.axes import CONFIG_COLUMNS, CONFIG_LABELS, LEAVES
    from kvlab.seed_format import SEED_BUDGETS

    flags = {leaf.flag for leaf in LEAVES}
    for kind in BUDGETS:
        assert kind in flags and kind in CONFIG_COLUMNS and kind in CONFIG_LABELS
    assert set(SEED_BUDGETS.values()) <= set(BUDGETS)
    assert list(BUDGETS) == [c for c in CONFIG_COLUMNS if c in BUDGETS]
