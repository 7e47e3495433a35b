"""Where the bits go, as config fields: head budgets (``heads``: AdaKV, CriticalAdaKV), a values'
format apart from the keys' (``value_quant``) and 16-bit layers (``skip_layers``).  Validation and
its messages, labels, a sweep's and a tune's dimensions, the form's columns and widgets, the serve
flags and the recommendation (with the engines' equivalent, or "no equivalent")."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import ValidationError

from kvlab.core.experiment_spec import ExperimentSpec, dump_spec, parse_spec
from kvlab.core.kv_config import KVCacheConfig, SweepGrid
from kvlab.core.methods import HEAD_BUDGETS, METHODS, methods_headwise

ADA = KVCacheConfig(evict="snapkv", ratio=0.5, heads="adakv")


def _error(**fields) -> str:
    with pytest.raises(ValidationError) as raised:
        KVCacheConfig(**fields)
    return str(raised.value)


def test_a_head_budget_needs_a_method_whose_scores_differ_by_head_and_a_count_budget():
    assert ADA.label == "snapkv:r0.5/ada"
    assert KVCacheConfig(evict="knorm", keep_tokens=64, heads="Critical-AdaKV", alpha_safeguard=0.5).label \
        == "knorm:n64/cada0.5"  # the name forgiven as other names are; a safeguard off kvpress's default shown
    assert "needs an eviction method" in _error(heads="adakv")
    for method in ("streaming_llm", "tova", "pyramidkv", "criticalkv", "observed_attention"):
        assert not METHODS[method].headwise
        budget = {"ratio": 0.5}
        assert METHODS[method].heads_refusal in _error(evict=method, heads="adakv", **budget)
    assert "critical_adakv is its head-wise form" in _error(evict="criticalkv", ratio=0.5, heads="adakv")
    assert "got threshold" in _error(evict="snapkv", threshold=0.5, heads="adakv")
    assert "a decode policy" in _error(evict="knorm", heads="adakv", decode={"interval": 8, "target_tokens": 64})
    assert "read by head-wise budgets only" in _error(evict="knorm", ratio=0.5, alpha_safeguard=0.3)
    assert "less than or equal to 1" in _error(evict="knorm", ratio=0.5, heads="adakv", alpha_safeguard=1.5)
    assert set(methods_headwise()) >= {"snapkv", "knorm", "expected_attention", "keydiff"}


def test_a_sweep_grid_and_a_tune_space_offer_head_budgets():
    import optuna

    from kvlab.core.tune_spec import TuneSpec, candidate_grid

    grid = SweepGrid(evict=["none", "snapkv", "streaming_llm"], ratios=[0.5, 0.75], heads=["uniform", "adakv"],
                     decode=[{"interval": 100, "target_tokens": 300}])
    labels = [c.label for c in grid.expand()]
    # snapkv: uniform, uniform with the policy, adakv (never with a policy); streaming_llm: uniform, with policy
    assert grid.size() == len(labels) == 1 + 2 * 3 + 2 * 2
    assert "snapkv:r0.75/ada" in labels and not any("ada/" in label or "streaming_llm:r0.5/ada" in label
                                                     for label in labels)
    with pytest.raises(ValidationError, match="evict needs one of"):
        SweepGrid(evict=["streaming_llm"], heads=["adakv"])
    with pytest.raises(ValidationError, match="twice"):
        SweepGrid(evict=["knorm"], heads=["adakv", "adakv"])
    only = SweepGrid(evict=["none", "knorm"], ratios=[0.5], heads=["critical_adakv"])
    assert [c.label for c in only.expand()] == ["baseline", "knorm:r0.5/cada"]
    spec = ExperimentSpec(name="x", tasks=[{"name": "passkey"}], sweep=grid)
    assert parse_spec(tomllib.loads(dump_spec(spec))).sweep == grid

    tune = TuneSpec(quant=["none", "int4"], evict=["knorm", "streaming_llm"], budget_range=(0.25, 0.5),
                    heads=["uniform", "adakv", "critical_adakv"])
    points = candidate_grid(tune)
    assert len(points) == tune.space().size() == 2 * (3 * 3 + 3)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    proposed = [KVCacheConfig(**tune.space().suggest(study.ask())) for _ in range(60)]
    assert {c.heads for c in proposed if c.evict == "knorm"} == set(HEAD_BUDGETS)
    assert {c.heads for c in proposed if c.evict == "streaming_llm"} == {"uniform"}
    with pytest.raises(ValidationError, match="evict needs one of"):
        TuneSpec(evict=["none", "streaming_llm"], heads=["adakv"])


def test_the_form_edits_head_budgets_in_the_table_the_grid_and_the_tune():
    from kvlab.core.tune_spec import TuneSpec
    from kvlab.dashboard.spec_form import assign_errors, build_spec, form_from_spec

    configs = [KVCacheConfig(evict="knorm", keep_tokens=64, heads="critical_adakv", alpha_safeguard=0.4),
               KVCacheConfig(quant="int4")]
    spec = ExperimentSpec(name="x", tasks=[{"name": "passkey"}], configs=configs,
                          sweep=SweepGrid(evict=["none", "knorm"], heads=["uniform", "adakv"]))
    form = form_from_spec(spec)
    assert form.configs[0]["heads"] == "critical_adakv" and form.configs[0]["alpha_safeguard"] == 0.4
    assert form.values["sweep.heads"] == ["uniform", "adakv"]
    result = build_spec(form.values, form.n_tasks, form.configs, form.base)
    assert result.errors == {} and result.spec.configs == spec.configs and result.spec.sweep == spec.sweep
    # a head budget on a method that cannot share its scores: the message names the row
    rows = [dict(form.configs[0], evict="streaming_llm"), form.configs[1]]
    errors = assign_errors(build_spec(form.values, form.n_tasks, rows, form.base).errors, ["configs"])[0]
    assert any(m.startswith("row 1:") and "the same for every head" in m for m in errors["configs"])
    tuned = ExperimentSpec(name="t", tasks=[{"name": "passkey"}],
                           tune=TuneSpec(evict=["knorm"], heads=["uniform", "adakv"]))
    form = form_from_spec(tuned)
    assert form.values["tune.heads"] == ["uniform", "adakv"]
    assert build_spec(form.values, form.n_tasks, form.configs, form.base).spec.tune == tuned.tune


def test_serve_takes_a_head_budget_and_the_recommendation_says_the_engines_have_none():
    from kvlab.cli.main import build_parser
    from kvlab.cli.serve import kv_config_from_args
    from kvlab.tune.recommend import engine_flag, serve_command

    config = KVCacheConfig(evict="snapkv", keep_tokens=256, heads="critical_adakv", alpha_safeguard=0.35,
                           query_aware=True)
    argv = serve_command("smollm2-135m", config).split()[1:]
    assert argv[-4:] == ["--heads", "critical_adakv", "--alpha-safeguard", "0.35"]
    assert kv_config_from_args(build_parser().parse_args(argv)) == config
    for kind in ("vllm", "sglang"):
        assert engine_flag(kind, config)["flag"] is None
        assert "no equivalent" in engine_flag(kind, config)["statement"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--heads", "everyone"])


def test_the_form_edits_key_and_value_formats_and_16_bit_layers():
    from kvlab.dashboard.spec_form import assign_errors, build_spec, form_from_spec

    configs = [KVCacheConfig(quant="int8", value_quant="int4"),
               KVCacheConfig(quant="int4", skip_layers={"first": 2, "layers": [7, 9]}, evict="knorm", ratio=0.5)]
    spec = ExperimentSpec(name="x", tasks=[{"name": "passkey"}], configs=configs)
    form = form_from_spec(spec)
    assert form.configs[0]["value_quant"] == "int4" and "skipped_first" not in form.configs[0]
    assert form.configs[1]["skipped_first"] == 2 and form.configs[1]["skipped_layers"] == "7, 9"
    result = build_spec(form.values, form.n_tasks, form.configs, form.base)
    assert result.errors == {} and result.spec.configs == spec.configs
    rows = [form.configs[0], dict(form.configs[1], skipped_layers="7, x")]
    errors = assign_errors(build_spec(form.values, form.n_tasks, rows, form.base).errors, ["configs"])[0]
    assert any(m.startswith("row 2: 16-bit: layers (indices)") for m in errors["configs"])


def test_value_formats_and_16_bit_layers_validate_label_and_serve():
    from kvlab.cli.main import build_parser
    from kvlab.cli.serve import kv_config_from_args
    from kvlab.tune.recommend import engine_flag, serve_command

    assert KVCacheConfig(quant="int8", value_quant="int4").label == "k:int8/v:int4/g64/r64"
    assert KVCacheConfig(quant="int4", skip_layers={"first": 2, "last": 2}).label == "int4/g64/r64/16b:f2l2"
    assert "quant's format already" in _error(quant="int4", value_quant="int4")
    assert "set quant (or value_quant)" in _error(skip_layers={"first": 1})
    assert "names no layer" in _error(quant="int4", skip_layers={})
    assert not KVCacheConfig(quant="none", value_quant="int4").is_baseline
    skip = KVCacheConfig(quant="fp8_e4m3", skip_layers={"first": 2, "last": 1, "layers": [7]})
    assert skip.skip_layers.indices(30) == {0, 1, 7, 29}
    assert skip.for_layer(29, 30).quant == "none" and skip.for_layer(3, 30) == skip
    for config in (skip, KVCacheConfig(quant="int8", value_quant="int4", residual_length=32)):
        argv = serve_command("smollm2-135m", config).split()[1:]
        assert kv_config_from_args(build_parser().parse_args(argv)) == config
    # vLLM keeps layers 16-bit with a flag of its own; one --kv-cache-dtype cannot split keys and values
    assert engine_flag("vllm", skip, num_layers=30)["flag"] == \
        "--kv-cache-dtype fp8_e4m3 --kv-cache-dtype-skip-layers 0 1 7 29"
    assert "the last 1 layers' indices" in engine_flag("vllm", skip)["flag"]
    assert engine_flag("sglang", skip)["flag"] is None
    split = KVCacheConfig(quant="fp8_e4m3", value_quant="int4")
    assert all("stores keys and values alike" in engine_flag(kind, split)["statement"] for kind in ("vllm", "sglang"))


def test_a_sweep_and_a_tune_offer_value_formats_and_16_bit_layers():
    import optuna

    from kvlab.core.tune_spec import TuneSpec

    grid = SweepGrid(quant=["none", "int8", "int4"], value_quant=["int4", "int8"],
                     skip_layers=[{"first": 2, "last": 2}])
    labels = [c.label for c in grid.expand()]
    # none: baseline, K16V4, K16V8; int8: same, V4; int4: same, V8 -- each quantizing one also 16b:f2l2
    assert grid.size() == len(labels) == 1 + 2 * 2 + 2 * 2 + 2 * 2
    assert {"k:int8/v:int4/g64/r64", "k:int4/v:int8/g64/r64/16b:f2l2", "k:none/v:int4/g64/r64"} <= set(labels)
    assert "k:int8/v:int8/g64/r64" not in labels  # a format is never offered as its own value format
    with pytest.raises(ValidationError, match="add a format to quant or value_quant"):
        SweepGrid(quant=["none"], skip_layers=[{"first": 1}])
    spec = ExperimentSpec(name="x", tasks=[{"name": "passkey"}], sweep=grid)
    assert parse_spec(tomllib.loads(dump_spec(spec))).sweep == grid
    tune = TuneSpec(quant=["int8", "int4"], value_quant=["int4", "int8", "none"], skip_layers=[{"first": 1}],
                    evict=["none"])
    space = tune.space()
    points = {KVCacheConfig(**p).label for p in space.points()}
    assert len(points) == space.size() == 2 * 3 * 2
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    proposed = {KVCacheConfig(**space.suggest(study.ask())).label for _ in range(80)}
    assert proposed <= points and len(proposed) >= 10


def test_kvzip_is_query_agnostic_shares_its_own_budget_and_scores_in_the_prefill_only():
    from kvlab.cli.main import build_parser
    from kvlab.cli.serve import kv_config_from_args
    from kvlab.core.tune_spec import TuneSpec

    assert KVCacheConfig(evict="kvzip", ratio=0.5).label == "kvzip:r0.5"
    assert "query-agnostic" in _error(evict="kvzip", ratio=0.5, query_aware=True)
    assert "already shared out across heads" in _error(evict="kvzip", ratio=0.5, heads="adakv")
    assert "once, after the prefill" in _error(evict="kvzip", decode={"interval": 8, "target_tokens": 64})
    assert "its budgets: ratio, keep_fraction" in _error(evict="kvzip", keep_tokens=64)
    with pytest.raises(ValidationError, match="kvzip is query-agnostic"):
        SweepGrid(evict=["snapkv", "kvzip"], query_aware=True)
    with pytest.raises(ValidationError, match="kvzip is query-agnostic"):
        TuneSpec(evict=["kvzip"], query_aware=True)
    # kvlab serve marks eviction query-aware (it sees the question), but not KVzip's: it scores the prompt
    assert kv_config_from_args(build_parser().parse_args(["serve", "--evict", "kvzip", "--ratio", "0.5"])) \
        == KVCacheConfig(evict="kvzip", ratio=0.5)
