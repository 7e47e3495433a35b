"""Model files that are not what they claim (issue 18, item 14): the user's input, so ``kvlab run``
exits 2 with one line naming the file and why, before anything is stored -- not 1 "internal error"
with the library's complaint (``ValueError: GGUF magic invalid``), and never transformers' prompt
to run a checkpoint's own code.

Whole ``kvlab run`` processes on files written here: random bytes named ``.gguf``, a GGUF cut
short, a directory whose config.json maps the model to its own code (``auto_map``), one whose
weights are garbage, one whose config.json is not JSON, and SmolLM2's own config.json and weights
without its tokenizer files (transformers substitutes a 3-token tokenizer, and building the first
item from it grew memory until the OOM killer: 3.4 GB after 77 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.store import Store
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.model  # each case is a whole `kvlab run` that reads real weights with transformers

ROOT = Path(__file__).resolve().parents[2]
#: A small Llama config: what transformers needs to try the weights.
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
         "max_position_embeddings": 1024}


def _garbage_gguf(folder: Path) -> Path:
    path = folder / "garbage.gguf"
    path.write_bytes(os.urandom(8192))
    return path


def _cut_gguf(folder: Path) -> Path:
    path = folder / "cut.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x07" * 40)  # a version-3 header, then nonsense
    return path


def _custom_code(folder: Path) -> Path:
    path = folder / "custom-code"
    path.mkdir()
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (path / "config.json").write_text(json.dumps(LLAMA | {"model_type": "xcustom", "auto_map": auto_map}))
    (path / "modeling_x.py").write_text("raise SystemExit('kvlab ran the checkpoint code')\n")
    return path


def _broken_weights(folder: Path) -> Path:
    path = folder / "broken-weights"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA))
    (path / "model.safetensors").write_bytes(b"\xff" * 4096)
    return path


def _no_tokenizer(folder: Path) -> Path:
    """SmolLM2's real config.json and weights (linked, not copied), and nothing else."""
    from kvlab.models.checkpoints import model_dir

    path = folder / "no-tokenizer"
    path.mkdir()
    for name in ("config.json", "model.safetensors"):
        (path / name).symlink_to(model_dir("smollm2-135m") / name)
    return path


def _broken_config(folder: Path) -> Path:
    path = folder / "broken-config"
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "llama",')
    return path


CASES = {
    "garbage-gguf": (_garbage_gguf, "not a GGUF model kvlab can read (GGUF magic invalid)"),
    "cut-gguf": (_cut_gguf, "not a GGUF model kvlab can read ("),
    "custom-code": (_custom_code, "its config.json (auto_map) needs the model's own Python code for model_type "
                                  "'xcustom', which transformers does not ship; kvlab never runs a checkpoint's code"),
    "broken-weights": (_broken_weights, "transformers cannot load this model directory ("),
    "broken-config": (_broken_config, "its config.json cannot be read as JSON ("),
    "no-tokenizer": (_no_tokenizer, "has no tokenizer (tokenizer.json, "),
}


@pytest.mark.parametrize("case", CASES)
def test_kvlab_run_on_a_broken_model_file_is_exit_2_with_one_line(case, tmp_path):
    make, reason = CASES[case]
    model = make(tmp_path)
    spec = tmp_path / "spec.toml"
    spec.write_text((ROOT / "examples" / "tiny.toml").read_text().replace('model = "smollm2-135m"',
                                                                        f"model = {json.dumps(str(model))}"))
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    done = subprocess.run([sys.executable, "-m", "kvlab.cli", "run", str(spec)], capture_output=True, text=True,
                          env={**os.environ, "KVLAB_DATABASE_URL": url, "KVLAB_HOME": str(tmp_path / "home")},
                          stdin=subprocess.DEVNULL, timeout=SAFETY_S)

    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr and "[y/N]" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [done.stderr.splitlines()[-1]], done.stderr
    assert errors[0].startswith(f"error: {model.resolve()}: {reason}"), errors[0]
    with Store(url) as store:
        assert store.list_experiments() == []  # refused before anything was stored
