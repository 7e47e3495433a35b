"""The format and method registries: every consumer reads them, and they match the pinned kvpress."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import kvpress
import pytest
import torch

from kvlab.cli.main import build_parser
from kvlab.compress.eviction import make_scorer, scorer_key
from kvlab.compress.quantization import FP8_DTYPES
from kvlab.core.errors import ConfigError
from kvlab.core.formats import FORMATS, INT_BITS
from kvlab.core.kv_config import EVICTION_METHODS, QUANT_DTYPES, KVCacheConfig, SweepGrid
from kvlab.core.methods import BUDGET_BOUNDS, METHODS, PARAMS, REFUSED
from kvlab.dashboard.compare_view import QUANT_BITS
from kvlab.dashboard.spec_form import BUDGET_RANGE, default_form
from kvlab.engines.servers import SERVERS
from kvlab.spec_files import parse_spec_toml


def _scorer_presses() -> set[str]:
    return {name for name, obj in vars(kvpress).items()
            if inspect.isclass(obj) and issubclass(obj, kvpress.ScorerPress) and obj is not kvpress.ScorerPress}


def test_every_kvpress_scorer_press_is_registered_or_refused_with_a_reason():
    registered = {m.press for m in METHODS.values()}
    replaying = {m.press for m in METHODS.values() if m.replays_context}  # KVzip: a BasePress scored by its replay
    assert replaying == {"KVzipPress"} and not replaying & _scorer_presses()
    assert _scorer_presses() | replaying == registered | set(REFUSED)
    assert not registered & set(REFUSED)
    assert all(len(reason) > 20 for reason in REFUSED.values())


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_names_a_real_press_and_real_arguments(name):
    method = METHODS[name]
    press = getattr(kvpress, method.press)
    arguments = inspect.signature(press).parameters
    assert set(method.params.values()) <= set(arguments) or method.wraps, name
    assert set(method.params) <= set(PARAMS) and set(method.params) <= set(KVCacheConfig.model_fields)
    assert method.budgets and set(method.budgets) <= {"ratio", "keep_fraction", "threshold", "keep_tokens"}
    if method.budget_dependent or method.scorer is None or method.layer_budgets:
        assert "threshold" not in method.budgets  # a threshold needs scores that ignore the budget
    if method.budget_dependent:
        assert "keep_tokens" not in method.budgets  # its scores read a fraction of the context


def test_method_parameters_build_the_press_kvlab_asks_for():
    config = KVCacheConfig(evict="cur", ratio=0.5, n_sink=7)
    assert make_scorer(scorer_key(config), seed=0).num_sinks == 7
    snap = scorer_key(KVCacheConfig(evict="snapkv", ratio=0.5, window_size=32))
    assert scorer_key(KVCacheConfig(evict="pyramidkv", ratio=0.3, window_size=32)) == snap  # shared scores
    assert make_scorer(snap, seed=0).window_size == 32
    critical = make_scorer(scorer_key(KVCacheConfig(evict="criticalkv", keep_fraction=0.25)), seed=0)
    assert isinstance(critical.press, kvpress.SnapKVPress) and critical.compression_ratio == 0.75
    # a budget-dependent press scores once per budget
    assert scorer_key(KVCacheConfig(evict="compactor", ratio=0.5)) != scorer_key(
        KVCacheConfig(evict="compactor", ratio=0.25))
    assert scorer_key(KVCacheConfig(evict="streaming_llm", ratio=0.5)) is None  # positional


def test_config_fields_take_defaults_and_bounds_from_the_registry():
    for name, param in PARAMS.items():
        assert KVCacheConfig.model_fields[name].default == param.default
        KVCacheConfig(**{name: param.low}), KVCacheConfig(**{name: param.high})
        with pytest.raises(ValueError):
            KVCacheConfig(**{name: param.high + 1})
    assert EVICTION_METHODS == ("none", *METHODS) and QUANT_DTYPES == tuple(FORMATS)


@pytest.mark.parametrize("name", list(METHODS))
def test_budgets_accepted_and_refused_per_method(name):
    method = METHODS[name]
    for budget in ("ratio", "keep_fraction", "threshold"):
        if budget in method.budgets:
            assert KVCacheConfig(evict=name, **{budget: 0.5}).evict == name
        else:
            with pytest.raises(ValueError, match=f"its budgets: {', '.join(method.budgets)}"):
                KVCacheConfig(evict=name, **{budget: 0.5})
    for edge in BUDGET_BOUNDS:  # both ends excluded
        with pytest.raises(ValueError):
            KVCacheConfig(evict=name, ratio=edge)


def test_aliases_of_formats_and_methods():
    assert KVCacheConfig(quant="FP8").quant == "fp8_e4m3"
    assert KVCacheConfig(evict="H2O", ratio=0.5).evict == "observed_attention"
    for method in METHODS.values():
        for alias in method.aliases:
            assert KVCacheConfig(evict=alias, ratio=0.5).evict == method.name


def test_formats_and_their_engine_names():
    for fmt in FORMATS.values():
        if fmt.kind == "int":
            assert fmt.group_sizes == (32, 64, 128) and "channel" in fmt.choices("key_axis")
            assert fmt.storage_dtype == "uint8"
        if fmt.kind == "fp8":
            assert FP8_DTYPES[fmt.name] == getattr(torch, fmt.storage_dtype)
            assert torch.finfo(FP8_DTYPES[fmt.name]).max == fmt.fp8_max
        for server in SERVERS.values():  # each engine either stores a format or says what it has instead
            assert not (fmt.name in server.kv_dtypes and fmt.name in server.format_notes), (fmt.name, server.kind)
            if fmt.name not in server.kv_dtypes:  # its own note, or whose format it is
                assert server.format_note(fmt.name) != "it has no such KV cache format", (fmt.name, server.kind)
    assert SERVERS["sglang"].kv_dtypes["fp8_e4m3"] != "fp8"  # SGLang rejects plain fp8
    assert "int2" not in SERVERS["vllm"].kv_dtypes  # vLLM has no 2-bit KV cache
    assert all(set(server.kv_dtypes) <= set(FORMATS) for server in SERVERS.values())
    assert INT_BITS == {"int8": 8, "int4": 4, "int2": 2}
    assert QUANT_BITS == {name: f.bits_per_value for name, f in FORMATS.items()}  # llama.cpp's with their scales


def test_serve_flags_read_the_registries():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    actions = {a.dest: a for a in serve._actions}
    assert tuple(actions["quant"].choices) == tuple(FORMATS)
    assert tuple(actions["evict"].choices) == ("none", *METHODS)
    for value in ("0", "1", "1.5"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--ratio", value])
    assert build_parser().parse_args(["serve", "--ratio", "0.25"]).ratio == 0.25


def test_kvlab_methods_lists_every_method_its_budgets_and_whether_it_was_checked():
    out = subprocess.run([sys.executable, "-m", "kvlab.cli", "methods"], capture_output=True, text=True,
                         check=True).stdout
    for method in METHODS.values():
        line = next(line for line in out.splitlines() if line.strip().startswith(method.name + " "))
        assert ", ".join(method.budgets) in line and method.press in line
        assert ("NOT checked" not in line) == method.checked_on_default_model
    for press, reason in REFUSED.items():
        assert f"{press}: {reason}" in out
    for fmt in FORMATS.values():
        assert fmt.name in out


def test_form_bounds_and_defaults_match_the_model():
    low, high = BUDGET_RANGE
    assert BUDGET_BOUNDS[0] < low < high < BUDGET_BOUNDS[1]
    values = default_form().values
    grid = SweepGrid()
    assert values["sweep.ratios"] == ", ".join(f"{r:g}" for r in grid.ratios)
    assert values["sweep.group_size"] == grid.group_size
    assert values["sweep.residual_length"] == grid.residual_length
    assert values["sweep.query_aware"] == grid.query_aware
    assert set(values["sweep.quant"]) <= set(FORMATS) and set(values["sweep.evict"]) <= {"none", *METHODS}


def test_blog_format_reads_the_registries():
    spec, _ = parse_spec_toml('[kv_cache]\ndtype = "fp8"\nsparse_top_k = 0.5\neviction_method = "cur"\n')
    config = spec.configs[0]
    assert (config.quant, config.evict, config.keep_fraction) == ("fp8_e4m3", "cur", 0.5)
    with pytest.raises(ConfigError, match="pyramidkv.*cannot take eviction_threshold"):
        parse_spec_toml('[kv_cache]\neviction_threshold = 0.5\neviction_method = "pyramidkv"\n')


def test_a_registry_entry_is_plain_data():
    for entry in [*METHODS.values(), *FORMATS.values()]:
        assert dataclasses.is_dataclass(entry) and entry.__dataclass_params__.frozen
