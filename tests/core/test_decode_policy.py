"""Decode policies (compression during generation) as config fields: validation and its messages,
labels, the round trip through JSON and TOML, the serve flags and the recommendation, the memory a
decision compares once a config compresses during generation, and the report's table."""

from __future__ import annotations

import json
import shlex
import tomllib

import pytest
from pydantic import ValidationError

from kvlab.core.experiment_spec import ExperimentSpec, dump_spec, parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import METHODS, methods_that_decode
from kvlab.core.results import TRACE_POINTS, GenerationKV
from tests.store.test_store import make_result

KNORM = KVCacheConfig(evict="knorm", decode={"interval": 48, "target_tokens": 300})


def _error(**fields) -> str:
    with pytest.raises(ValidationError) as raised:
        KVCacheConfig(**fields)
    return str(raised.value)


def test_a_decode_policy_needs_a_method_that_scores_during_generation():
    assert "needs an eviction method" in _error(decode={"interval": 8, "ratio": 0.5})
    refused = _error(evict="h2o", decode={"interval": 8, "ratio": 0.5})
    assert "cannot score during generation" in refused and METHODS["observed_attention"].decode_refusal in refused
    assert "leverage" not in methods_that_decode() and "knorm" in methods_that_decode()
    assert "exactly one of target_tokens" in _error(evict="knorm", decode={"interval": 8})
    assert "exactly one of target_tokens" in _error(evict="knorm", decode={"interval": 8, "ratio": 0.5,
                                                                          "target_tokens": 9})
    # SnapKV reads its last window_size hidden states: the buffer and the interval must hold more
    assert "interval and buffer above it" in _error(evict="snapkv", decode={"interval": 64, "target_tokens": 9})
    assert "interval and buffer above it" in _error(evict="snapkv", window_size=8,
                                                    decode={"interval": 64, "target_tokens": 9, "buffer": 8})
    assert "unknown" not in _error(evict="knorm", decode={"interval": 0, "ratio": 0.5})  # a bound, not a typo
    assert "Extra inputs" in _error(evict="knorm", decode={"interval": 8, "ratio": 0.5, "every": 3})


def test_the_prompt_budget_is_optional_with_a_decode_policy_and_labels_say_both():
    assert KNORM.label == "knorm/dec48:t300"
    both = KVCacheConfig(quant="int4", evict="streaming_llm", ratio=0.4, decode={"interval": 32, "ratio": 0.4,
                                                                                 "buffer": 0})
    assert both.label == "int4/g64/r64+streaming_llm:r0.4/dec32:r0.4/b0"
    assert not KNORM.is_baseline and KNORM.removed_fraction is None
    with pytest.raises(ValidationError, match="needs exactly one budget"):
        KVCacheConfig(evict="knorm")  # without a decode policy a method still needs its budget


def test_decode_policies_survive_json_toml_and_the_spec():
    assert KVCacheConfig(**json.loads(json.dumps(KNORM.model_dump(mode="json")))) == KNORM
    spec = ExperimentSpec(name="x", tasks=[{"name": "recall"}], configs=[KNORM])
    again = parse_spec(tomllib.loads(dump_spec(spec)))
    assert again.configs == [KNORM] and again.all_configs()[1].decode == KNORM.decode


def test_a_task_that_generates_nothing_refuses_decode_policies():
    with pytest.raises(ValidationError, match="perplexity task generates nothing"):
        ExperimentSpec(name="x", tasks=[{"name": "perplexity"}], configs=[KNORM])


def test_serve_flags_and_the_recommendation_carry_the_policy():
    from kvlab.cli.main import build_parser
    from kvlab.cli.serve import kv_config_from_args
    from kvlab.core.errors import ConfigError
    from kvlab.tune.recommend import config_toml, serve_command

    config = KVCacheConfig(evict="knorm", ratio=0.5, query_aware=True,
                           decode={"interval": 48, "target_tokens": 300, "buffer": 64})
    command = serve_command("smollm2-135m", config)
    assert command.endswith("--decode-interval 48 --decode-target-tokens 300 --decode-buffer 64")
    assert kv_config_from_args(build_parser().parse_args(shlex.split(command)[1:])) == config
    entry = tomllib.loads(config_toml(config))["configs"][0]
    assert KVCacheConfig(**{k: v for k, v in entry.items() if k != "name"}) == config
    with pytest.raises(ConfigError, match="exactly one of target_tokens"):
        kv_config_from_args(build_parser().parse_args(["serve", "--evict", "knorm", "--decode-interval", "8"]))


def test_a_generation_trace_is_thinned_keeping_its_first_last_and_peak_points():
    trace = [(100 + i, 1000 + (5000 if i == 77 else 10 * i)) for i in range(500)]
    kv = GenerationKV.from_trace(trace, baseline_bytes=123_456)
    assert len(kv.tokens) <= TRACE_POINTS + 2
    assert kv.tokens[0] == 100 and kv.tokens[-1] == 599 and 177 in kv.tokens
    assert kv.peak_bytes == 6000 and kv.final_bytes == trace[-1][1] and kv.final_tokens == 599
    assert kv.final_ratio == pytest.approx(123_456 / trace[-1][1])
    assert kv.bytes_per_token == pytest.approx(trace[-1][1] / 599)
    assert GenerationKV.from_dict(json.loads(json.dumps(kv.to_dict()))) == kv


def _generated(name: str, config: dict, peak: int, final_baseline: int, item: str = "recall-0"):
    trace = GenerationKV.from_trace([(500, peak // 2), (510, peak), (520, peak // 2)], final_baseline)
    return make_result(item, name, task="recall", config=config, peak_kv_bytes=peak,
                       extra={"generation_kv": trace.to_dict()})


def test_with_a_decode_policy_every_config_is_compared_on_its_peak_over_the_request():
    from kvlab.analysis.summary import MEMORY_AFTER_PROMPT, MEMORY_REQUEST_PEAK, summarize
    from kvlab.experiments.report import generation_table

    rows = [_generated("baseline", {"quant": "none"}, peak=12_000, final_baseline=12_000),
            _generated("knorm/dec48:t300", KNORM.model_dump(mode="json"), peak=6_000, final_baseline=12_000)]
    summaries = {s.config_name: s for s in summarize(rows)}
    assert {s.memory_basis for s in summaries.values()} == {MEMORY_REQUEST_PEAK}
    assert summaries["knorm/dec48:t300"].physical_kv_bytes == 6_000
    assert summaries["knorm/dec48:t300"].compression_ratio == pytest.approx(2.0)
    assert summaries["baseline"].compression_ratio == pytest.approx(1.0)
    table = generation_table(rows)
    assert "knorm/dec48:t300" in table and "baseline" in table and "final ratio" in table
    # without one, the cache after the prompt, as always
    prompt_only = summarize([make_result(), make_result(config_name="int4", physical_kv_bytes=368_640_000 // 4,
                                                        config={"quant": "int4"})])
    assert {s.memory_basis for s in prompt_only} == {MEMORY_AFTER_PROMPT}
    assert generation_table([make_result()]) == ""


def test_the_form_edits_a_decode_policy_as_columns_and_places_its_errors():
    from kvlab.dashboard.spec_form import assign_errors, build_spec, form_from_spec

    def table_errors(rows) -> list[str]:
        return assign_errors(build_spec(form.values, form.n_tasks, rows, form.base).errors, ["configs"])[0]["configs"]

    spec = ExperimentSpec(name="x", tasks=[{"name": "recall"}], configs=[KNORM, KVCacheConfig(quant="int4")])
    form = form_from_spec(spec)
    assert form.configs[0]["decode_interval"] == 48 and form.configs[0]["decode_target_tokens"] == 300
    assert "decode" not in form.configs[0] and "decode_interval" not in form.configs[1]
    result = build_spec(form.values, form.n_tasks, form.configs, form.base)
    assert result.errors == {} and result.spec.configs == spec.configs
    # a policy without its target: the message names the row and the policy
    rows = [dict(form.configs[0], decode_target_tokens=None), form.configs[1]]
    assert any(message.startswith("row 1: decode:") and "exactly one of target_tokens" in message
               for message in table_errors(rows))
    # a bad value of one field lands on its column
    rows = [dict(form.configs[0], decode_interval=0), form.configs[1]]
    assert any(message.startswith("row 1: decode: every (passes)") for message in table_errors(rows))


def test_a_sweep_grid_and_a_tune_space_offer_decode_policies():
    import optuna

    from kvlab.core.kv_config import SweepGrid
    from kvlab.core.tune_spec import TuneSpec, candidate_grid

    policy = {"interval": 32, "target_tokens": 256}
    grid = SweepGrid(quant=["none", "int4"], evict=["none", "knorm", "h2o"], ratios=[0.5], decode=[policy])
    labels = [c.label for c in grid.expand()]
    assert grid.size() == len(labels) == 8
    assert "knorm:r0.5/dec32:t256" in labels and "int4/g64/r64+knorm:r0.5/dec32:t256" in labels
    assert not any("observed_attention" in label and "dec" in label for label in labels)  # H2O cannot
    with pytest.raises(ValidationError, match="need a method that scores during generation"):
        SweepGrid(evict=["h2o"], decode=[policy])
    with pytest.raises(ValidationError, match="decode dec32:t256 with snapkv: .*interval and buffer above it"):
        SweepGrid(evict=["snapkv"], decode=[policy])
    with pytest.raises(ValidationError, match="lists a policy twice"):
        SweepGrid(evict=["knorm"], decode=[policy, policy])
    tune = TuneSpec(quant=["none"], evict=["none", "knorm"], budget_range=(0.25, 0.5), decode=[policy])
    points = candidate_grid(tune)
    assert len(points) == tune.space().size() == 2 * 3
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    proposed = [KVCacheConfig(**tune.space().suggest(study.ask())) for _ in range(40)]
    assert {c.decode is not None for c in proposed if c.evict == "knorm"} == {True, False}
    spec = ExperimentSpec(name="x", tasks=[{"name": "recall"}], sweep=grid)
    assert parse_spec(tomllib.loads(dump_spec(spec))).sweep == grid


def test_the_form_keeps_a_sweeps_decode_policies():
    from kvlab.core.kv_config import SweepGrid
    from kvlab.dashboard.spec_form import build_spec, form_from_spec

    grid = SweepGrid(evict=["none", "knorm"], decode=[{"interval": 32, "target_tokens": 256}])
    spec = ExperimentSpec(name="x", tasks=[{"name": "recall"}], sweep=grid)
    form = form_from_spec(spec)
    assert build_spec(form.values, form.n_tasks, form.configs, form.base).spec.sweep == grid
