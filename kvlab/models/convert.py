"""Convert a GGUF file once into a float32 transformers checkpoint, and prove the copy is faithful.

Loading a GGUF dequantizes every tensor in Python (SmolLM2 ~15-45 s, Gemma 3 ~40-120 s on two
cores); the saved safetensors reload in a second or two.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvlab.core.model_registry import ModelNotAvailableError, ModelSpec, Progress

from .arch import model_arch
from .checkpoints import write_manifest
from .errors import reading
from .gguf_tokenizer import build_tokenizer, read_gguf_vocab
from .quiet import library_output

PROBE_TEXT = "The capital of France is Paris.\nKV caches grow with every token: 12345 tokens!"
# Saving and reloading float32 tensors is lossless; anything above this means a broken conversion.
MAX_LOGIT_DIFF = 1e-4


def convert_gguf(gguf: Path, out_dir: Path, progress: Progress, spec: ModelSpec | None = None) -> dict:
    """Write model + tokenizer + manifest to ``out_dir``; return the manifest.

    With ``spec``, also check that the converted model has the architecture and chat-template
    status the registry promises.  The libraries' logs and bars are off unless verbose (:mod:`.quiet`).
    """
    with library_output():
        return _convert(gguf, out_dir, progress, spec)


def _convert(gguf: Path, out_dir: Path, progress: Progress, spec: ModelSpec | None) -> dict:
    progress(f"Reading the tokenizer from {gguf.name}")
    with reading(gguf, "not a GGUF model kvlab can read"):
        tokenizer = build_tokenizer(read_gguf_vocab(gguf))
        progress(f"Loading and dequantizing {gguf.name} (the slow step)")
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    if spec is not None:
        _check_against_spec(spec, model, tokenizer)
    if len(tokenizer) > model.config.get_text_config().vocab_size:
        raise ModelNotAvailableError(
            f"{gguf.name}: tokenizer has {len(tokenizer)} tokens but the embedding only "
            f"{model.config.get_text_config().vocab_size}"
        )

    # Some transformers versions (not 5.2) attach a quantization_config to GGUF loads and then
    # refuse to save the model.
    if getattr(model.config, "quantization_config", None) is not None:
        model.hf_quantizer = None  # type: ignore[assignment]  # set by from_pretrained, undeclared in its stubs
        del model.config.quantization_config
    progress(f"Saving float32 safetensors to {out_dir}")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

    progress("Verifying: reloading and comparing logits")
    max_diff, probe_tokens = _verify_reload(model, tokenizer, out_dir)
    manifest = {
        "gguf_file": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
        "gguf_sha256": spec.gguf_sha256 if spec else _sha256(gguf),
        "registry_name": spec.name if spec else None,
        "display_name": spec.display_name if spec else gguf.stem,
        "source": spec.source if spec else f"local file {gguf}",
        "license": spec.license if spec else "unknown",
        "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "dtype": "float32",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "verification": {"probe_tokens": probe_tokens, "max_abs_logit_diff": max_diff},
    }
    write_manifest(out_dir, manifest)
    return manifest


def _verify_reload(model, tokenizer, out_dir: Path) -> tuple[float, int]:
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out_dir)
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    problems = []
    if reloaded_tokenizer(PROBE_TEXT, return_tensors="pt").input_ids.tolist() != ids.tolist():
        problems.append("the reloaded tokenizer encodes the probe text differently")
    if reloaded_tokenizer.eos_token != tokenizer.eos_token:
        problems.append(f"eos token changed: {tokenizer.eos_token!r} -> {reloaded_tokenizer.eos_token!r}")
    if reloaded_tokenizer.chat_template != tokenizer.chat_template:
        problems.append("chat template changed on reload")
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        diff = (model(ids).logits - reloaded(ids).logits).abs().max().item()
    if diff > MAX_LOGIT_DIFF:
        problems.append(f"reloaded logits differ by up to {diff:.3g}")
    if problems:
        raise ModelNotAvailableError(f"Conversion check failed for {out_dir}: " + "; ".join(problems))
    return diff, ids.shape[1]


def _check_against_spec(spec: ModelSpec, model, tokenizer) -> None:
    arch = model_arch(model.config)
    fields = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "max_context", "sliding_window")
    problems = [
        f"{name} is {getattr(arch, name)}, expected {getattr(spec, name)}"
        for name in fields
        if getattr(arch, name) != getattr(spec, name)
    ]
    if bool(tokenizer.chat_template) != spec.has_chat_template:
        problems.append(f"chat template present: {bool(tokenizer.chat_template)}, expected {spec.has_chat_template}")
    if tokenizer.eos_token is None or tokenizer.eos_token_id != model.generation_config.eos_token_id:
        problems.append(
            f"eos token {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) disagrees with the model's "
            f"generation config (eos id {model.generation_config.eos_token_id})"
        )
    if problems:
        raise ModelNotAvailableError(
            f"{spec.name}: the converted model is not what the registry says: " + "; ".join(problems)
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
