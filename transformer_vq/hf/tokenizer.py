"""The tokenizer of an exported model as ``tokenizer.json`` + ``tokenizer_config.json``, which
``transformers.AutoTokenizer.from_pretrained`` loads with its stock fast tokenizer (no remote code, no sentencepiece).

Two kinds of runs, two tokenizers (both built with the ``tokenizers`` library):

- **bytes** (vocabulary 256: enwik8, Shakespeare, ``text``, ...): token id = byte value, as
  :func:`transformer_vq.data.codec.encode_bytes`. A byte-level BPE with no merges over GPT-2's 256 byte symbols:
  ``encode(text) == list(text.encode("utf-8"))`` and ``decode`` gives any text back. The model has no special token,
  but clients need one (``lm-eval`` decodes the end-of-text token and pads batches), so byte 0 (NUL) doubles as the
  end-of-text and padding token; ``decode(..., skip_special_tokens=True)`` drops NUL bytes.
- **SentencePiece** (PG-19): the run's :class:`~transformer_vq.data.tokenizer.ExactTokenizer` model, translated
  piece for piece (same ids; BPE merges ranked by piece score, byte fallback, user-defined pieces kept whole, spaces
  as ``▁``, no normalization). The ids equal the library's for every text without U+2581 (``▁``): the library cuts
  the text at that character and emits its three UTF-8 byte pieces, which no stock tokenizer can express, so there
  the stock tokenizer gives SentencePiece's own ids (``▁`` read as a space). Decoding the library's ids gives the
  text exactly (``skip_special_tokens=True`` drops ``</s>``, as the library's decode does).

Special tokens are never read out of the text (``split_special_tokens``): the text ``</s>`` (or ``Ā``, the symbol of
byte 0) is tokenized as text, as the library does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from transformer_vq.config import ConfigError
from transformer_vq.data.codec import BYTE_VOCAB
from transformer_vq.data.tokenizer import SPACE_SYMBOL, TRAINER_OPTIONS

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Where a SentencePiece model is copied to, beside the tokenizer.json translated from it (transformers' own name).
SENTENCEPIECE_FILE = "tokenizer.model"
# The context a client may fill: the model has no length limit (its state is bounded), but clients need a number
# (lm-eval cuts documents into windows of this many tokens, each scored without the previous one), so a long one.
MODEL_MAX_LENGTH = 1 << 20
# SentencePiece's piece types (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4


def write_run_tokenizer(directory: Path, vocab_size: int, sentencepiece_model: Path | None) -> list[str]:
    """Write the tokenizer of a model of ``vocab_size`` tokens into ``directory``: the byte tokenizer for 256, else
    the one translated from ``sentencepiece_model`` (copied beside it). Returns the names of the files written."""
    if vocab_size == BYTE_VOCAB:
        return write_tokenizer(directory, *byte_tokenizer())
    if sentencepiece_model is None:
        raise ConfigError(f"--ckpt: the model reads {vocab_size} tokens, not bytes, and its run holds no tokenizer "
                          f"(a PG-19 run keeps it as {SENTENCEPIECE_FILE} in the run directory); put it back there, or "
                          f"export the weights alone with --format safetensors")
    proto = Path(sentencepiece_model).read_bytes()
    tokenizer, special = sentencepiece_tokenizer(proto, sentencepiece_model)
    if tokenizer.get_vocab_size() > vocab_size:
        raise ConfigError(f"--ckpt: the run's tokenizer {sentencepiece_model} has {tokenizer.get_vocab_size()} "
                          f"pieces, more than the model's {vocab_size} tokens: it is not this model's tokenizer")
    (directory / SENTENCEPIECE_FILE).write_bytes(proto)
    return [*write_tokenizer(directory, tokenizer, special), SENTENCEPIECE_FILE]


def write_tokenizer(directory: Path, tokenizer, special: dict[str, str]) -> list[str]:
    """``tokenizer.json`` (a ``tokenizers.Tokenizer``) and the ``tokenizer_config.json`` that names the stock class
    and the special tokens (``special``: e.g. ``{"eos_token": "</s>"}``)."""
    tokenizer.save(str(directory / TOKENIZER_FILE))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # the name every transformers version knows
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,  # decode returns the text, spaces before punctuation included
        "split_special_tokens": True,
        # batched generate needs prompts padded on the left (transformers counts right padding into the positions
        # it passes, which the model refuses); forward and scoring take either side, and lm-eval pads as it needs
        "padding_side": "left",
        **special,
    }
    (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]


def byte_tokenizer():
    """``(tokenizer, special tokens)`` of byte-level models: id = byte value, NUL as end-of-text and padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbol = bytes_to_unicode()  # byte -> the printable character that stands for it in GPT-2's vocabulary
    tokenizer = Tokenizer(models.BPE(vocab={symbol[byte]: byte for byte in range(BYTE_VOCAB)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([symbol[0]])
    return tokenizer, {"eos_token": symbol[0], "pad_token": symbol[0]}


def sentencepiece_tokenizer(model_proto: bytes, name="the tokenizer"):
    """``(tokenizer, special tokens)`` translated from a SentencePiece model trained with the library's
    :data:`~transformer_vq.data.tokenizer.TRAINER_OPTIONS` (another model is refused: its normalization could not be
    reproduced)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    proto = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    check_trainer_options(proto, name)
    pieces = list(proto.pieces)
    vocab = {piece.piece: i for i, piece in enumerate(pieces)}
    unk = pieces[proto.trainer_spec.unk_id].piece
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=score_ranked_merges(pieces), unk_token=unk, fuse_unk=True,
                                     byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", SPACE_SYMBOL)
    user_defined = sorted((p.piece for p in pieces if p.type == USER_DEFINED), key=len, reverse=True)
    if user_defined:  # SentencePiece emits them whole, wherever they occur
        pattern = "|".join(re.escape(piece) for piece in user_defined)
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE_SYMBOL, " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    tokenizer.add_special_tokens([p.piece for p in pieces if p.type in (UNKNOWN, CONTROL)])
    special = {"unk_token": unk}
    eos_id = proto.trainer_spec.eos_id
    if eos_id >= 0:  # the end-of-document token; it pads too (clients pad batches; the model never sees padding)
        special.update(eos_token=pieces[eos_id].piece, pad_token=pieces[eos_id].piece)
    if proto.trainer_spec.bos_id >= 0:
        special["bos_token"] = pieces[proto.trainer_spec.bos_id].piece
    return tokenizer, special


def check_trainer_options(proto, name) -> None:
    """Refuse a SentencePiece model whose encoding the translation would not reproduce."""
    spec, trainer = proto.normalizer_spec, proto.trainer_spec
    found = {
        "model_type": trainer.model_type == trainer.BPE,
        "normalization_rule_name": spec.name == TRAINER_OPTIONS["normalization_rule_name"],
        "remove_extra_whitespaces": spec.remove_extra_whitespaces == TRAINER_OPTIONS["remove_extra_whitespaces"],
        "add_dummy_prefix": spec.add_dummy_prefix == TRAINER_OPTIONS["add_dummy_prefix"],
        "byte_fallback": trainer.byte_fallback == TRAINER_OPTIONS["byte_fallback"],
        "escape_whitespaces": spec.escape_whitespaces,
    }
    differ = sorted(option for option, same in found.items() if not same)
    if differ:
        raise ConfigError(f"--ckpt: {name} was not trained with `tvq tokenizer`'s settings (it differs in "
                          f"{', '.join(differ)}); export the weights alone with --format safetensors")


def score_ranked_merges(pieces) -> list[tuple[str, str]]:
    """BPE merges in SentencePiece's order: a pair of pieces merges when their concatenation is a normal piece,
    pairs forming the higher-scoring piece first (ties: the lower id)."""
    normal = {p.piece: (-p.score, i) for i, p in enumerate(pieces) if p.type == NORMAL}
    ranked = sorted((rank, piece[:k], piece[k:]) for piece, rank in normal.items() for k in range(1, len(piece))
                    if piece[:k] in normal and piece[k:] in normal)
    return [(left, right) for _, left, right in ranked]
