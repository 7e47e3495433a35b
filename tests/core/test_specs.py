"""Config validation, sweep expansion, TOML round trip and the seed-blog format."""

from __future__ import annotations

import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec, dump_spec, parse_spec
from kvlab.core.kv_config import KVCacheConfig, SweepGrid
from kvlab.spec_files import load_spec

TASKS = [{"name": "passkey", "context_lengths": [1024]}]


def test_aliases_and_labels():
    config = KVCacheConfig(quant="INT4", evict="h2o", ratio=0.5)
    assert config.evict == "observed_attention"
    assert config.label == "int4/g64/r64+observed_attention:r0.5"
    assert KVCacheConfig().label == "baseline" and KVCacheConfig().is_baseline


@pytest.mark.parametrize("fields, fragment", [
    ({"quant": "int3"}, "quant"),
    ({"group_size": 48}, "group_size"),
    ({"evict": "magic", "ratio": 0.5}, "evict"),
    ({"evict": "snapkv"}, "exactly one budget"),
    ({"evict": "snapkv", "ratio": 0.5, "keep_fraction": 0.5}, "exactly one budget"),
    ({"ratio": 0.5}, "evict = 'none'"),
    ({"evict": "snapkv", "ratio": 1.0}, "ratio"),
    ({"evict": "streaming_llm", "threshold": 0.5}, "threshold works with"),
    ({"query_aware": True}, "query_aware"),
    ({"bogus": 1}, "bogus"),
])
def test_invalid_configs_name_the_field(fields, fragment):
    with pytest.raises(ConfigError) as info:
        parse_spec({"tasks": TASKS, "configs": [fields]})
    assert fragment in str(info.value)
    assert "configs.0" in str(info.value)


def test_allowed_values_are_listed():
    with pytest.raises(ConfigError) as info:
        parse_spec({"tasks": TASKS, "configs": [{"quant": "int3"}]})
    assert "'int8'" in str(info.value) and "'fp8_e4m3'" in str(info.value)


def test_baseline_added_first_and_sweep_expanded():
    spec = parse_spec({"tasks": TASKS, "configs": [{"quant": "int4"}],
                       "sweep": {"quant": ["none", "int2"], "evict": ["none", "snapkv"], "ratios": [0.5, 0.75]}})
    labels = [c.label for c in spec.all_configs()]
    assert labels[0] == "baseline"
    assert len(labels) == len(set(labels)) == 1 + 1 + 1 + 2 + 2  # baseline, int4, int2, snapkv x2, int2+snapkv x2


def test_duplicate_names_rejected():
    with pytest.raises(ConfigError, match="duplicate"):
        parse_spec({"tasks": TASKS, "configs": [{"name": "a"}, {"name": "a", "quant": "int8"}]})


def test_max_context_length_checked():
    with pytest.raises(ConfigError, match="exceed max_context_length"):
        parse_spec({"tasks": [{"name": "passkey", "context_lengths": [4096]}], "configs": [{}],
                    "max_context_length": 2048})


def test_toml_round_trip(tmp_path):
    spec = parse_spec({"name": "rt", "seed": 7, "tasks": TASKS,
                       "configs": [{"name": "x", "quant": "int2", "evict": "knorm", "threshold": 0.3}],
                       "sweep": {"quant": ["int8"], "evict": ["tova"], "ratios": [0.25]}})
    path = tmp_path / "spec.toml"
    path.write_text(dump_spec(spec))
    again, warnings = load_spec(path)
    assert again == spec and warnings == []


def test_examples_parse():
    from pathlib import Path

    for path in sorted(Path(__file__).resolve().parents[2].joinpath("examples").glob("*.toml")):
        spec, _ = load_spec(path)
        assert isinstance(spec, ExperimentSpec) and spec.all_configs()


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_spec(tmp_path / "missing.toml")


def _seed(tmp_path, text):
    path = tmp_path / "seed.toml"
    path.write_text(text)
    return load_spec(path)


def test_seed_blog_mapping(tmp_path):
    spec, warnings = _seed(tmp_path, """
[server]
base_url = "http://127.0.0.1:9/v1"
api_key = "sk-secret"
model_id = "m"
[kv_cache]
dtype = "int4"
sparse_top_k = 0.5
max_context_length = 2048
""")
    config = spec.all_configs()[1]
    assert (config.quant, config.evict, config.keep_fraction) == ("int4", "snapkv", 0.5)
    assert spec.backend.kind == "openai_compat" and spec.backend.base_url == "http://127.0.0.1:9/v1"
    assert "sk-secret" not in dump_spec(spec)
    assert any("api_key is ignored" in w for w in warnings)
    assert any("cannot be applied" in w for w in warnings)


def test_seed_threshold_and_target_ratio(tmp_path):
    spec, _ = _seed(tmp_path, "[kv_cache]\nbits = 8\neviction_threshold = 0.3\n")
    config = spec.all_configs()[1]
    assert (config.quant, config.threshold) == ("int8", 0.3)
    spec, warnings = _seed(tmp_path, "[kv_cache]\ndtype = 'int4'\ncompression_ratio = 8.0\n")
    config = spec.all_configs()[1]
    assert config.evict == "snapkv" and 0.4 < config.keep_fraction < 0.5
    assert any("compression_ratio = 8" in w for w in warnings)


@pytest.mark.parametrize("body, fragment", [
    ("[kv_cache]\ncompression_ratio = 0.5\n", "target ratio"),
    ("[kv_cache]\nbits = 3\n", "allowed values are 16, 8, 4, 2"),
    ("[kv_cache]\nsparse_top_k = 0.5\neviction_threshold = 0.2\n", "competing budgets"),
    ("[kv_cache]\nradix_attention_cache_size = 5\n", "unknown keys"),
])
def test_seed_errors(tmp_path, body, fragment):
    with pytest.raises(ConfigError, match=fragment):
        _seed(tmp_path, body)


@pytest.mark.parametrize("grid", [
    {"quant": ["int8"]},
    {"quant": ["none", "int4", "fp8_e4m3"], "evict": ["none", "snapkv", "knorm"], "ratios": [0.25, 0.5, 0.75]},
    {"evict": ["snapkv", "tova"], "ratios": [0.5]},
    {"quant": ["int2", "int8"], "evict": ["none"], "ratios": [0.1, 0.2]},
])
def test_sweep_size_counts_what_expand_builds(grid):
    """The bound on configs counts the grid without expanding it: the count must be the expansion's."""
    sweep = SweepGrid(**grid)
    assert sweep.size() == len(sweep.expand()) == len(set(sweep.expand()))


def test_a_tune_on_a_task_without_a_score_is_refused_at_validation():
    """Refused before anything is stored (it was found only once the tune's driver started)."""
    with pytest.raises(ConfigError, match=r"tasks\.1\.name: kvlab tune decides on accuracy.*passkey"):
        parse_spec({"tasks": [{"name": "passkey", "context_lengths": [256]},
                              {"name": "perplexity", "context_lengths": [256]}],
                    "tune": {"quant": ["none", "int8"]}})


def test_run_backend_override_drops_what_only_the_old_kind_reads():
    from kvlab.cli.run import with_backend_kind

    spec = parse_spec({"tasks": [{"name": "passkey"}], "configs": [{"name": "int8", "quant": "int8"}],
                       "backend": {"kind": "openai_compat", "base_url": "http://127.0.0.1:9/v1", "model_id": "m",
                                   "max_retries": 5}})
    embedded = with_backend_kind(spec, "embedded")
    assert (embedded.backend.kind, embedded.backend.base_url, embedded.backend.model_id) == ("embedded", None, None)
    assert embedded.backend.max_retries == 5  # a setting every backend reads stays
    served = with_backend_kind(embedded.model_copy(update={"backend": embedded.backend.model_copy(
        update={"device": "cpu"})}), "vllm")
    assert (served.backend.kind, served.backend.device) == ("vllm", "auto")
