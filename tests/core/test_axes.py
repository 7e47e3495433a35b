"""The table of config axes (kvlab.core.axes) is the one declaration the consumers derive from: every
KVCacheConfig field has its entry, `kvlab serve`'s options and the recommendation's `serve_command` are
inverses on a config of every axis, the configs table's rows give back the config, and the [sweep] and
[tune] tables read as they did and round-trip through the store's JSON."""

from __future__ import annotations

import argparse
import shlex
import tomllib
from pathlib import Path

import pytest

from kvlab.cli.serve import add_serve_parser, kv_config_from_args
from kvlab.core.axes import AXES, AXIS_BY_FIELD, CONFIG_COLUMNS, CONFIG_LABELS, LEAVES
from kvlab.core.experiment_spec import parse_spec, spec_to_dict
from kvlab.core.formats import SETTINGS
from kvlab.core.kv_config import GridAxes, KVCacheConfig, SweepGrid
from kvlab.core.methods import METHODS
from kvlab.core.tune_spec import TuneSpec
from kvlab.dashboard.spec_form import config_row, config_rows
from kvlab.tune.recommend import serve_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: A config that sets each axis off its default at least once (together they cover every field).
CONFIGS = [
    KVCacheConfig(name="named", quant="int4", group_size=32, residual_length=0, key_axis="token"),
    KVCacheConfig(quant="int8", value_quant="int2", skip_layers={"first": 2, "last": 1, "layers": [5, 7]}),
    KVCacheConfig(quant="fp8_e4m3", group_size=128, evict="snapkv", ratio=0.75, window_size=32, query_aware=True),
    KVCacheConfig(evict="streaming_llm", keep_tokens=300, n_sink=8),
    KVCacheConfig(evict="snapkv", keep_fraction=0.4, heads="adakv", alpha_safeguard=0.3),
    KVCacheConfig(evict="knorm", threshold=0.3),
    KVCacheConfig(evict="snapkv", window_size=16, decode={"interval": 64, "ratio": 0.5, "buffer": 128}),
    KVCacheConfig(evict="streaming_llm", ratio=0.5, decode={"interval": 32, "target_tokens": 200}),
    KVCacheConfig(quant="q4_0", rotation=False),  # a serving engine's setting: kvlab serve has no option for it
]


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvlab")
    add_serve_parser(parser.add_subparsers())
    return parser


def test_every_config_field_is_one_axis_and_the_configs_cover_them():
    assert sorted(axis.field for axis in AXES) == sorted(KVCacheConfig.model_fields)
    assert len(AXIS_BY_FIELD) == len(AXES)
    set_somewhere = {field for config in CONFIGS for field in config.model_dump(exclude_defaults=True)}
    assert set_somewhere == set(KVCacheConfig.model_fields)


def test_a_leaf_reads_its_type_and_bounds_from_the_field():
    by_column = {leaf.column: leaf for leaf in LEAVES}
    assert by_column["group_size"].choices == SETTINGS["group_size"].choices
    assert by_column["evict"].choices == ("none", *METHODS)
    ratio = by_column["ratio"]
    assert (ratio.kind, ratio.low, ratio.high, ratio.low_open, ratio.high_open) == ("float", 0.0, 1.0, True, True)
    assert (by_column["decode_interval"].kind, by_column["decode_interval"].default) == ("int", None)
    assert by_column["skipped_layers"].kind == "ints" and by_column["skipped_layers"].flag == "skip_layers"
    assert by_column["query_aware"].flag is None and by_column["name"].flag is None
    assert set(CONFIG_COLUMNS) <= set(CONFIG_LABELS)


#: What kvlab serve takes: a rotation is a serving engine's setting, which its engine refuses
#: (tests/engines/test_llamacpp.py)
SERVED = [config for config in CONFIGS if config.rotation is None]


@pytest.mark.parametrize("config", SERVED, ids=lambda c: c.label)
def test_serve_options_and_serve_command_are_inverses(config):
    """`kvlab serve`'s server marks eviction query-aware itself (it sees the question), and takes no name."""
    argv = shlex.split(serve_command("smollm2-135m", config))[1:]
    served = kv_config_from_args(_serve_parser().parse_args(argv))
    method = METHODS.get(config.evict)
    expected = config.model_copy(update={"name": "", "query_aware": method is not None and not method.replays_context})
    assert served == expected


def test_a_bad_option_is_refused_naming_the_option():
    parser = _serve_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--ratio", "1.0"])
    from kvlab.core.errors import ConfigError
    with pytest.raises(ConfigError, match="--decode-interval"):
        kv_config_from_args(parser.parse_args(["serve", "--evict", "snapkv", "--decode-target-tokens", "9"]))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label)
def test_the_configs_table_gives_back_the_config(config):
    row = config_rows([config.model_dump(exclude_defaults=True, mode="json")])[0]
    assert set(CONFIG_COLUMNS) <= set(row) | {c for c in CONFIG_COLUMNS if c.startswith(("decode_", "skipped_"))}
    assert KVCacheConfig(**config_row(row)) == config


GRID = {"quant": ["none", "int4"], "value_quant": ["int2"], "skip_layers": [{"first": 1}], "evict": ["none", "snapkv"],
        "query_aware": True, "heads": ["uniform", "adakv"], "decode": [{"interval": 128, "target_tokens": 256}]}


def test_sweep_and_tune_share_their_axes_and_round_trip():
    sweep = GRID | {"ratios": [0.25, 0.5], "group_size": 32, "residual_length": 16}
    tune = GRID | {"group_sizes": [32, 128], "residual_lengths": [0, 64], "budget": "ratio",
                   "budget_range": [0.25, 0.75], "budget_step": 0.25, "max_trials": 5}
    shared = set(GridAxes.model_fields)
    assert shared < set(SweepGrid.model_fields) and shared < set(TuneSpec.model_fields)
    assert {a.sweep for a in AXES if a.sweep} - {"ratios"} <= set(SweepGrid.model_fields)
    assert {a.tune for a in AXES if a.tune} <= set(TuneSpec.model_fields)
    for table, body in (("sweep", sweep), ("tune", tune)):
        spec = parse_spec({"name": "axes", "model": "smollm2-135m",
                           "tasks": [{"name": "passkey", "num_items": 2}], table: body})
        again = parse_spec(spec_to_dict(spec))
        assert again == spec
    grid = SweepGrid(**sweep)
    assert grid.size() == len(grid.expand()) == len({c.label for c in grid.expand()})
    space = TuneSpec(**tune).space()
    assert space.settings == {"group_size": (32, 128), "residual_length": (0, 64)}
    assert space.size() == len(list(space.points()))


def test_grids_refuse_a_value_twice_alike():
    with pytest.raises(ValueError, match="lists int4 twice"):
        SweepGrid(quant=["int4", "int4"])
    with pytest.raises(ValueError, match="lists int4 twice"):
        TuneSpec(quant=["int4", "int4"])
    with pytest.raises(ValueError, match="lists 32 twice"):
        TuneSpec(group_sizes=[32, 32])


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_example_reads_and_round_trips(path):
    from kvlab.spec_files import load_spec

    spec, _ = load_spec(path)
    assert parse_spec(spec_to_dict(spec)) == spec
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    for table in ("sweep", "tune"):
        if table in raw and table in spec_to_dict(spec):
            assert set(raw[table]) <= set(spec_to_dict(spec)[table])
