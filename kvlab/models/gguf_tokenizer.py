"""Build a Hugging Face tokenizer from the vocabulary stored in a GGUF file.

transformers 5.2 can read a tokenizer from a GGUF file, but gets both of our models wrong:
- SmolLM2 (``tokenizer.ggml.model == "gpt2"``): bos and eos are swapped into ``eos = <|im_start|>``,
  a BOS is prepended although the file says ``add_bos_token = False``, and five CodeLlama FIM tokens
  are appended beyond the model's vocabulary.
- Gemma 3 (``"llama"``, i.e. SentencePiece BPE): the pieces are loaded into a *Unigram* model, so
  "capital" comes out as "c|ap|it|al", and no ``<bos>`` is added although Gemma needs it.

So we rebuild the tokenizer from the raw GGUF fields, following llama.cpp's semantics (the runtime
these files were made for): control pieces are special tokens, user-defined pieces (Gemma's
whitespace runs, HTML tags) match the raw text literally before normalisation, SentencePiece BPE
merges the adjacent pair whose concatenation has the highest score first, and bytes fall back to
``<0xXX>`` pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from kvlab.core.model_registry import ModelNotAvailableError

# llama.cpp token types (the same numbers as SentencePiece's piece types).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer split patterns for byte-level BPE vocabularies, keyed by `tokenizer.ggml.pre`
# (regexes from the models' own tokenizer.json files). None: GPT-2's regex inside ByteLevel.
_BYTE_LEVEL_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt-2": None,
    "smollm": None,  # plus a Digits split, see _byte_level_pre_tokenizer
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}


class UnsupportedTokenizerError(ModelNotAvailableError):
    """The GGUF file holds a tokenizer kind we do not rebuild faithfully."""


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer fields of a GGUF file (`tokenizer.ggml.*`, `tokenizer.chat_template`)."""

    model: str  # "gpt2": byte-level BPE with merges; "llama": SentencePiece BPE with scores
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    pre: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    chat_template: str | None = None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def read_gguf_vocab(path: Path) -> GGUFVocab:
    """Read the tokenizer fields of a GGUF file (memory-mapped; no tensors are loaded)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields

    def get(key: str, default=None):
        field = fields.get(key)
        return default if field is None else field.contents()

    return GGUFVocab(
        model=get("tokenizer.ggml.model", ""),
        tokens=get("tokenizer.ggml.tokens", []),
        token_types=get("tokenizer.ggml.token_type", []),
        scores=get("tokenizer.ggml.scores"),
        merges=get("tokenizer.ggml.merges"),
        pre=get("tokenizer.ggml.pre"),
        bos_id=get("tokenizer.ggml.bos_token_id"),
        eos_id=get("tokenizer.ggml.eos_token_id"),
        unk_id=get("tokenizer.ggml.unknown_token_id"),
        pad_id=get("tokenizer.ggml.padding_token_id"),
        add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", False)),
        chat_template=get("tokenizer.chat_template"),
    )


def build_tokenizer(vocab: GGUFVocab) -> PreTrainedTokenizerFast:
    """A transformers tokenizer equivalent to llama.cpp's tokenizer for this vocabulary."""
    if vocab.model == "gpt2":
        backend = _byte_level_bpe(vocab)
    elif vocab.model == "llama":
        backend = _sentencepiece_bpe(vocab)
    else:
        raise UnsupportedTokenizerError(
            f"GGUF tokenizer model {vocab.model!r} is not supported (kvlab rebuilds 'gpt2' byte-level BPE "
            "and 'llama' SentencePiece BPE vocabularies)"
        )
    # Pieces matched literally in the raw text before the model runs; control pieces are special.
    backend.add_tokens(
        [
            AddedToken(vocab.tokens[i], special=kind == CONTROL, normalized=False)
            for i, kind in enumerate(vocab.token_types)
            if kind in (CONTROL, USER_DEFINED)
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=vocab.token(vocab.bos_id),
        eos_token=vocab.token(vocab.eos_id),
        unk_token=vocab.token(vocab.unk_id),
        pad_token=vocab.token(vocab.pad_id),
        add_bos_token=vocab.add_bos,
        add_eos_token=vocab.add_eos,
        chat_template=vocab.chat_template,
        clean_up_tokenization_spaces=False,
    )


def _byte_level_bpe(vocab: GGUFVocab) -> Tokenizer:
    if vocab.merges is None:
        raise UnsupportedTokenizerError("byte-level BPE vocabulary without tokenizer.ggml.merges")
    pre = vocab.pre or "default"
    if pre not in _BYTE_LEVEL_SPLITS:
        raise UnsupportedTokenizerError(
            f"byte-level BPE pre-tokenizer {pre!r} is not supported (known: {', '.join(_BYTE_LEVEL_SPLITS)})"
        )
    merges = [tuple(merge.split(" ", 1)) for merge in vocab.merges]
    backend = Tokenizer(
        BPE(
            vocab={token: i for i, token in enumerate(vocab.tokens)},
            merges=merges,
            unk_token=vocab.token(vocab.unk_id),
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre, vocab.add_space_prefix)
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_level_pre_tokenizer(pre: str, add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    split = _BYTE_LEVEL_SPLITS[pre]
    if split is None:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
        if pre == "smollm":  # SmolLM's tokenizer splits every digit on its own before byte-level BPE
            return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        return byte_level
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
        ]
    )


def _sentencepiece_bpe(vocab: GGUFVocab) -> Tokenizer:
    """SentencePiece BPE as a `tokenizers` BPE: merges ranked by the score of the merged piece.

    SentencePiece merges any adjacent pair whose concatenation is a piece, highest score first
    (leftmost on ties). The equivalent merge table lists, for every normal piece, each split into
    two halves that can exist as symbols, ordered by the piece's score.
    """
    scores = vocab.scores
    if scores is None:
        raise UnsupportedTokenizerError("SentencePiece vocabulary without tokenizer.ggml.scores")
    tokens = list(vocab.tokens)
    ids = {token: i for i, token in enumerate(tokens)}
    normal = [i for i, kind in enumerate(vocab.token_types) if kind == NORMAL]

    # A single character that occurs inside pieces but only exists as a byte piece (Gemma: "\t",
    # stored as "<0x09>") must be a vocabulary entry of its own for the merge table to reach it.
    for i in normal:
        for char in tokens[i]:
            if char not in ids and len(char.encode()) == 1:
                byte_id = ids.get(f"<0x{ord(char):02X}>")
                if byte_id is not None:
                    tokens[byte_id] = char
                    ids[char] = byte_id

    merges: list[tuple[str, str]] = []
    for i in sorted(normal, key=lambda i: -scores[i]):
        piece = tokens[i]
        merges.extend(
            (piece[:cut], piece[cut:]) for cut in range(1, len(piece)) if piece[:cut] in ids and piece[cut:] in ids
        )
    backend = Tokenizer(
        BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=merges,
            unk_token=vocab.token(vocab.unk_id),
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [normalizers.Replace(" ", "\u2581")]
    if vocab.add_space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    decode_steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        decode_steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(decode_steps)
    return backend
