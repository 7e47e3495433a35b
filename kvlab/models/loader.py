"""Load a resolved checkpoint into memory with the facts the rest of kvlab needs."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from kvlab.core.model_registry import Progress

from .arch import ModelArch, model_arch
from .checkpoints import read_manifest
from .errors import ModelFileError, reading
from .quiet import library_output
from .resolve import resolve_model

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


@dataclass(kw_only=True)
class LoadedModel(ModelArch):
    """A model in eval mode, its tokenizer, where they came from, and its architecture facts."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # as the caller named it
    path: Path
    device: str
    dtype: str  # "float32", "bfloat16", "float16"
    has_chat_template: bool
    model_id: str  # "<name>@<fingerprint>", for provenance records


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """Only the tokenizer of a model kvlab can resolve (pulled, or a local directory)."""
    path = resolve_model(name_or_path)
    _refuse_custom_code(path)
    _refuse_no_tokenizer(path)
    with library_output(), reading(path, "transformers cannot load the tokenizer of this model directory"):
        return _usable(path, AutoTokenizer.from_pretrained(path, trust_remote_code=False))


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    """float32 on CPU: bf16 matmuls run ~100x slower than fp32 on these CPUs; bf16 on GPUs."""
    return "float32" if device == "cpu" else "bfloat16"


def load_model(
    name_or_path: str | Path,
    device: str | None = None,
    dtype: str | None = None,
    attn_implementation: str = "sdpa",
    progress: Progress | None = None,
) -> LoadedModel:
    """Resolve ``name_or_path`` (see :func:`resolve_model`) and load model and tokenizer.  A directory
    transformers cannot load (custom code, broken files) is a :class:`ModelFileError`."""
    path = resolve_model(name_or_path, progress)
    _refuse_custom_code(path)
    device = device or default_device()
    dtype = dtype or default_dtype(device.split(":")[0])
    try:
        torch_dtype = _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}") from None
    # a per-tensor bar on every (1 s) load is noise in logs and CLIs
    with library_output(), reading(path, "transformers cannot load this model directory"):
        model, loading = cast(tuple[PreTrainedModel, dict[str, Any]], AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, attn_implementation=attn_implementation, trust_remote_code=False,
            output_loading_info=True))  # the stubs do not know output_loading_info's (model, info) pair
        _refuse_uncovered(path, model, loading["missing_keys"])
        _refuse_no_tokenizer(path)  # after the weights, whose fault a broken directory names first
        tokenizer = _usable(path, AutoTokenizer.from_pretrained(path, trust_remote_code=False))
        fingerprint = model_fingerprint(path)
    model.to(device).eval()  # type: ignore[arg-type]  # transformers' @wraps(nn.Module.to) hides the bound self
    arch = model_arch(model.config)
    name = str(name_or_path)
    return LoadedModel(
        **vars(arch),
        model=model,
        tokenizer=tokenizer,
        name=name,
        path=path,
        device=device,
        dtype=str(torch_dtype).removeprefix("torch."),
        has_chat_template=bool(tokenizer.chat_template),
        model_id=f"{Path(name).name}@{fingerprint}",
    )


#: The files a tokenizer is built from (fast: tokenizer.json; sentencepiece; BPE and WordPiece vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt", "tiktoken.model")
#: Fewer tokens than this is no language model's vocabulary: transformers made a stand-in.
MIN_VOCABULARY = 256


def _refuse_no_tokenizer(path: Path) -> None:
    """A directory without tokenizer files: transformers would substitute a tokenizer of a few tokens, and
    building a task's prompt from it loops until memory runs out (measured: 3.4 GB after 77 s, growing)."""
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFileError(f"{path}: has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...): copy the model's "
                             "tokenizer files into the directory beside config.json")


def _refuse_uncovered(path: Path, model: PreTrainedModel, missing: Collection[str]) -> None:
    """Weights of the model that its checkpoint does not hold: transformers starts them from random values
    and only logs it, so a directory with a single tensor ran as a model and reached a verdict (issue 47).
    A tied weight (``lm_head`` sharing the embeddings) is not missing: transformers leaves it out of the list."""
    if missing:
        names = sorted(missing)
        raise ModelFileError(
            f"{path}: its weights do not cover the model: {len(names)} of its {len(model.state_dict())} weight "
            f"tensors are not in the checkpoint ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) and "
            "would start from random values; copy all of the model's *.safetensors files (and "
            "model.safetensors.index.json) into the directory")


def _usable(path: Path, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if len(tokenizer) < MIN_VOCABULARY:
        raise ModelFileError(f"{path}: its tokenizer has {len(tokenizer)} tokens, no model's vocabulary: copy the "
                             "model's own tokenizer files into the directory")
    return tokenizer


def _refuse_custom_code(path: Path) -> None:
    """A config.json whose ``auto_map`` points at the checkpoint's own Python classes, for a
    ``model_type`` transformers does not ship, cannot load without running that code, which kvlab
    never does (``trust_remote_code`` stays off; on a terminal transformers would even ask)."""
    from transformers import CONFIG_MAPPING

    with reading(path, "its config.json cannot be read as JSON"):
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ModelFileError(f"{path}: its config.json is not a JSON object")
    model_type = config.get("model_type")
    if config.get("auto_map") and model_type not in CONFIG_MAPPING:
        raise ModelFileError(
            f"{path}: its config.json (auto_map) needs the model's own Python code for model_type {model_type!r}, "
            "which transformers does not ship; kvlab never runs a checkpoint's code: use a model of an architecture "
            "transformers supports (llama, qwen2, gemma3...)")


def model_fingerprint(path: Path) -> str:
    """A short content id of a checkpoint, cheap enough to compute on every load.

    Hashes config.json (minus the transformers version that wrote it), the source GGUF's sha256
    when kvlab converted the model, and each safetensors file's name, size and header (tensor
    names, dtypes, shapes, offsets). Hashing the weights themselves would take seconds per GB.
    The same model converted on two hosts gets the same id.
    """
    config = json.loads((path / "config.json").read_text())
    config.pop("transformers_version", None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    digest.update(read_manifest(path).get("gguf_sha256", "").encode())
    for file in sorted(path.glob("*.safetensors")):
        with file.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = f.read(header_len)
        digest.update(json.dumps([file.name, file.stat().st_size]).encode() + header)
    return digest.hexdigest()[:12]
