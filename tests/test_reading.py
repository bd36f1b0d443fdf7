"""The reading boundary (transformer_vq/config/reading.py): a file that is not what its reader expects is an
UnreadableFile naming the path, what was expected and what to do, never a decoder's or a library's traceback."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from transformer_vq import TransformerVQ, preset
from transformer_vq.config.reading import UnreadableFile, check_safetensors, read_json, read_text
from transformer_vq.export import load_safetensors

HINT = "do this"


def refusal(read, path, what="a thing") -> str:
    with pytest.raises(UnreadableFile) as caught:
        read(path, what, HINT)
    return str(caught.value)


def test_text_files(tmp_path):
    (tmp_path / "ok.txt").write_text("caf\u00e9")
    assert read_text(tmp_path / "ok.txt", "a thing", HINT) == "caf\u00e9"
    (tmp_path / "bin").write_bytes(b"ab\xff\xfe")
    assert refusal(read_text, tmp_path / "bin") == (f"{tmp_path / 'bin'} is not a thing: it is not UTF-8 text (byte "
                                                    f"0xff at offset 2; a binary file?); do this")
    assert refusal(read_text, tmp_path) == f"{tmp_path} is a directory, not a thing; do this"
    assert refusal(read_text, tmp_path / "none") == (f"{tmp_path / 'none'} does not exist or is not a regular file "
                                                     f"(a thing was expected); do this")


def test_json_files(tmp_path):
    (tmp_path / "a.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "a.json", "a thing", HINT) == {"a": 1}
    (tmp_path / "b.json").write_text('{"a": 1,\n "b": }')
    assert refusal(read_json, tmp_path / "b.json") == (f"{tmp_path / 'b.json'} is not a thing: invalid JSON at line "
                                                       f"2, column 7 (Expecting value); do this")


def test_weights_that_are_not_safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    assert check_safetensors(path, "weights", HINT) == path
    torch.save({"w": torch.zeros(2)}, path)
    assert refusal(check_safetensors, path, "weights") == (
        f"{path} is not weights: it is a PyTorch pickle (torch.save), not a safetensors file; do this")
    path.write_bytes(b"\x10" + bytes(7) + b"garbage!garbage!")
    assert refusal(check_safetensors, path, "weights").startswith(
        f"{path} is not weights: not a valid safetensors file (Error while deserializing header")


def test_safetensors_whose_header_length_starts_like_a_pickle(tmp_path):
    """A header of 128 + 256 n bytes makes the file's first byte 0x80, the pickle's magic: still safetensors."""
    path = tmp_path / "model.safetensors"
    for width in range(1, 300):
        save_file({"w" * width: torch.zeros(2)}, str(path))
        if path.read_bytes()[:1] == b"\x80":
            break
    assert path.read_bytes()[:1] == b"\x80"
    assert check_safetensors(path, "weights", HINT) == path


def test_an_export_with_a_pickle_under_the_safetensors_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(preset("tiny").to_dict()))
    torch.save(TransformerVQ(preset("tiny")).state_dict(), tmp_path / "model.safetensors")
    with pytest.raises(UnreadableFile) as caught:
        load_safetensors(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'model.safetensors'} is not model weights in safetensors format: it is a PyTorch pickle "
        f"(torch.save), not a safetensors file; pass a directory written by tvq export --format safetensors, or "
        f"export the run again")
