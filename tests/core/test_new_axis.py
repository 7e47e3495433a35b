"""A new axis is one field of KVCacheConfig, declared once with its Axis: in a copy of kvlab whose only change
is that field, the axis shows in every face -- the config's check and label, the [sweep] and [tune] lists
(through the spec's JSON round trip), the config space's walk and its Optuna question, the configs table,
the grid widgets, `kvlab serve`'s option and the recommendation's command -- and no engine stores it until
its code says so (kvlab's cache and a launched server refuse it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

KVLAB = Path(__file__).resolve().parents[2] / "kvlab"
#: Where the new field goes: before the eviction method, after the rotation setting.
ANCHOR = "    evict: Annotated[EvictionMethod, Axis("
#: The whole change: one field, its axis on it.
NEW_FIELD = '''    dither: Annotated[bool | None, also_axis(
        "dither", "dither", "add noise before rounding keys and values", "Dither settings each quantizing config "
        "is also run with.")] = Field(default=None, description="Dither the quantization.")
'''

FACES = textwrap.dedent('''
    import argparse, json, shlex
    from kvlab.cli.serve import add_serve_parser, kv_config_from_args
    from kvlab.core.axes import CONFIG_COLUMNS, LEAVES
    from kvlab.core.experiment_spec import parse_spec, spec_to_dict
    from kvlab.core.kv_config import KVCacheConfig, SweepGrid
    from kvlab.core.tune_spec import TuneSpec
    from kvlab.dashboard.spec_form import config_row, config_rows, grid_widgets
    from kvlab.tune.recommend import serve_command

    faces = {}
    config = KVCacheConfig(quant="int4", dither=True)
    faces["label"] = config.label
    try:
        KVCacheConfig(dither=True)
    except ValueError as error:
        faces["refusal"] = str(error)
    faces["flag"] = [leaf.flag for leaf in LEAVES if leaf.column == "dither"]
    faces["column"] = "dither" in CONFIG_COLUMNS
    faces["row"] = KVCacheConfig(**config_row(config_rows([config.model_dump(exclude_defaults=True)])[0])) == config
    command = serve_command("smollm2-135m", config)
    faces["command"] = command
    parser = argparse.ArgumentParser(prog="kvlab")
    add_serve_parser(parser.add_subparsers())
    faces["served"] = kv_config_from_args(parser.parse_args(shlex.split(command)[1:])).dither
    spec = parse_spec({"name": "axis", "model": "smollm2-135m", "tasks": [{"name": "passkey", "num_items": 2}],
                       "sweep": {"quant": ["none", "int4"], "dither": [True]}})
    again = parse_spec(json.loads(json.dumps(spec_to_dict(spec))))
    faces["sweep"] = [c.label for c in again.sweep.expand()]
    faces["sweep_size"] = again.sweep.size()
    tune = TuneSpec(quant=["int4"], dither=[True, False], max_trials=3)

    class Trial:
        asked = {}

        def suggest_categorical(self, name, choices):
            self.asked[name] = list(choices)
            return choices[-1]

        def suggest_float(self, name, low, high, *, step=None):
            return low

    trial = Trial()
    faces["suggested"] = tune.space().suggest(trial)
    faces["asked"] = trial.asked.get("dither")
    faces["tune_size"] = tune.space().size()
    faces["widgets"] = [(w.key, w.kind) for w in grid_widgets("tune") if w.key == "dither"]
    # No engine stores it until its code says so: kvlab's cache and a launched server refuse it, in one line.
    from kvlab.compress.accounting import check_fits
    from kvlab.core.errors import ConfigError
    from kvlab.core.geometry import CacheGeometry
    from kvlab.engines.server_flags import check_config
    faces["embedded"] = check_fits(config, CacheGeometry(num_layers=30, num_kv_heads=3, head_dim=64))
    try:
        check_config("llamacpp", KVCacheConfig(quant="q4_0", dither=True))
    except ConfigError as error:
        faces["llamacpp"] = str(error)
    print(json.dumps(faces))
''')


def test_a_new_axis_is_one_field_and_shows_in_every_face(tmp_path):
    copy = tmp_path / "kvlab"
    shutil.copytree(KVLAB, copy, ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "core" / "kv_config.py"
    text = module.read_text()
    assert text.count(ANCHOR) == 1
    module.write_text(text.replace(ANCHOR, NEW_FIELD + ANCHOR))

    ran = subprocess.run([sys.executable, "-c", FACES], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    faces = json.loads(ran.stdout)

    assert faces["label"] == "int4/g64/r64/dither=true"
    assert "dither applies to quantized keys or values" in faces["refusal"]
    assert faces["flag"] == ["dither"] and faces["column"] and faces["row"]
    assert "--dither true" in faces["command"] and faces["served"] is True
    assert faces["sweep"] == ["baseline", "int4/g64/r64", "int4/g64/r64/dither=true"] and faces["sweep_size"] == 3
    assert faces["asked"] == ["none", "true", "false"] and faces["suggested"]["dither"] is False
    assert faces["tune_size"] == 3
    assert faces["widgets"] == [["dither", "multiselect"]]
    assert faces["embedded"] == "dither = true: kvlab's engine does not store it (the axis is declared, its storage " \
        "is not): drop it"
    assert faces["llamacpp"].startswith("config 'q4_0/dither=true': dither = true cannot run on llama.cpp")
