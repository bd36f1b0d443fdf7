"""A `tvq export --format hf` directory stands alone: AutoTokenizer loads its tokenizer with transformers' own class
(the library's token ids, exact round trips), and with trust_remote_code=True AutoConfig / AutoModelForCausalLM load
it in a process that never imported transformer_vq, with the run's logits; a process that did import it is
unaffected, and a library that is missing is named with the command that installs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from transformer_vq.cli import main  # noqa: E402
from transformer_vq.data.codec import decode_bytes, encode_bytes  # noqa: E402
from transformer_vq.data.pg19 import train_pg19_tokenizer  # noqa: E402
from transformer_vq.data.tokenizer import SPACE_SYMBOL, ExactTokenizer  # noqa: E402
from transformer_vq.hf import TransformerVQForCausalLM, TransformerVQHFConfig  # noqa: E402
from transformer_vq.hf.configuration import MODEL_TYPE  # noqa: E402
from transformer_vq.train.lm.build import model_from_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# ASCII, UTF-8 of two to four bytes, newlines, runs of spaces and tabs, and the texts of special tokens
TEXTS = ["the king shall speak", "naïve café — ½ ☃ 日本語 🎉 𝔘𝔫𝔦", "two\nlines\n\n\nand a blank", "  a   b    c  ",
         "\ttabs\t\tand\r\nCRLF", "", " ", "Ā byte 0's symbol, NUL \x00 and DEL \x7f", "</s> <unk> <0x41>",
         "12345.678 , . ;", "e\u0301 \u00a0 \u3000 \ufeff"]
X = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(0))


def no_remote_code(directory):
    """AutoTokenizer without running the directory's code (transformers still reads config.json)."""
    return AutoTokenizer.from_pretrained(directory, trust_remote_code=False)


def test_export_holds_tokenizer_and_remote_code(exported):
    assert sorted(p.name for p in exported.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "modeling_transformer_vq.py", "tokenizer.json",
        "tokenizer_config.json"]
    config = json.loads((exported / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "modeling_transformer_vq.TransformerVQHFConfig",
                                  "AutoModel": "modeling_transformer_vq.TransformerVQForCausalLM",
                                  "AutoModelForCausalLM": "modeling_transformer_vq.TransformerVQForCausalLM"}
    assert json.loads((exported / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_byte_tokenizer_gives_the_library_ids_and_round_trips(exported):
    tokenizer = no_remote_code(exported)
    assert type(tokenizer).__module__.startswith("transformers.")
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == encode_bytes(text), repr(text)
        assert tokenizer.decode(ids) == text, repr(text)
    assert len(tokenizer) == 256 and tokenizer.eos_token_id == tokenizer.pad_token_id == 0
    assert tokenizer.decode(encode_bytes("caf") + [0xC3]) == decode_bytes(encode_bytes("caf") + [0xC3])  # a cut char
    batch = tokenizer(["ab", "abcd"], padding=True)  # on the left, as batched generate needs
    assert batch["input_ids"] == [[0, 0, 97, 98], [97, 98, 99, 100]] and batch["attention_mask"][0] == [0, 0, 1, 1]


def test_prompts_the_exported_tokenizer_pads_generate_as_each_alone(trained_run, exported):
    """The user's first batch: ``model.generate(**tokenizer(prompts, padding=True))`` with the directory's own
    tokenizer, no padding side chosen, continues every prompt as it continues alone (the library's greedy tokens)."""
    reference, _, _ = model_from_checkpoint(str(trained_run), device="cpu")
    tokenizer, model = no_remote_code(exported), AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True)
    prompts = ["To be", "or not to be, that is"]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        got = model.generate(**batch, max_new_tokens=12, do_sample=False)[:, batch["input_ids"].shape[1]:]
    for row, prompt in enumerate(prompts):
        ids = torch.tensor([encode_bytes(prompt)])
        assert torch.equal(got[row], reference.generate(ids, 12, temperature=0)[0, ids.shape[1]:]), prompt


# The PG-19 test tree of tests/data/test_pg19.py, smaller: books with the characters that matter to SentencePiece.
BOOK = ("CHAPTER {i}.\n\nIt was the best of times, it was the worst of times; in the year 18{i:02d} the\n"
        "  coach  rolled on,\tand   Mr. Lorry said: \"Recalled to life.\"\r\n\n")
PG19 = {"train": {f"{100 + i}.txt": "".join(BOOK.format(i=(i * 7 + j) % 100) for j in range(30)) for i in range(3)},
        "validation": {"200.txt": "A short book — with “quotes”, naïve café, 日本語 and ▁ the space symbol.\n"},
        "test": {"300.txt": "  Leading spaces, trailing spaces  \n\n\n"}}


@pytest.fixture(scope="module")
def pg19_run(tmp_path_factory) -> tuple[Path, Path]:
    """``(run directory, tokenizer)``: a PG-19 run of the tiny model, its 400-piece tokenizer saved outside the run."""
    root = tmp_path_factory.mktemp("pg19")
    for split, books in PG19.items():
        (root / "pg19" / split).mkdir(parents=True)
        for name, text in books.items():
            (root / "pg19" / split / name).write_bytes(text.encode("utf-8"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TVQ_CACHE_DIR", str(root / "cache"))
        tokenizer = root / "pg19-400.model"
        train_pg19_tokenizer(root / "pg19", tokenizer, vocab_size=400, num_threads=1)
        assert main(["train", "--preset", "tiny", "--data", "pg19", "--data-path", str(root / "pg19"), "--run-dir",
                     str(root / "run"), "--data-option", f"tokenizer={tokenizer}", "--set", "model.vocab_size=400",
                     "--seq-len", "32", "--update-len", "16", "--batch-size", "2", "--steps", "1",
                     "--sample-tokens", "0", "--eval-tokens", "0", "--log-every", "1000"]) == 0
    return root / "run", tokenizer


def test_sentencepiece_tokenizer_gives_the_library_ids(pg19_run, tmp_path):
    run_dir, tokenizer_file = pg19_run
    out = tmp_path / "hf"
    assert main(["export", "--format", "hf", "--ckpt", str(run_dir), "--out", str(out)]) == 0
    assert (out / "tokenizer.model").read_bytes() == tokenizer_file.read_bytes()  # the run's, copied
    library, tokenizer = ExactTokenizer.load(tokenizer_file), no_remote_code(out)
    assert type(tokenizer).__module__.startswith("transformers.")
    assert (tokenizer.eos_token_id, tokenizer.unk_token_id, tokenizer.bos_token_id) == (1, 0, None)
    books = [text for split in PG19.values() for text in split.values()]
    for text in TEXTS + books:
        ids = library.encode(text)
        assert tokenizer.decode(ids, skip_special_tokens=True) == text, repr(text)  # decoding is exact everywhere
        if SPACE_SYMBOL in text:  # the library spells U+2581 in bytes; a stock tokenizer reads it as a space
            assert tokenizer.encode(text) == library.sp.encode(text) != ids
        else:
            assert tokenizer.encode(text) == ids, repr(text)
    assert tokenizer.decode(library.encode("end of book") + [library.eod_id], skip_special_tokens=True) == \
        library.decode(library.encode("end of book") + [library.eod_id])


def test_run_without_its_tokenizer_is_refused(pg19_run, tmp_path, capsys):
    run_dir, tokenizer_file = pg19_run
    moved = tmp_path / "run"  # the run without tokenizer.model, and the original it was copied from gone too
    shutil.copytree(run_dir, moved, ignore=shutil.ignore_patterns("tokenizer.model"))
    tokenizer_file.rename(tmp_path / "elsewhere.model")
    try:
        assert main(["export", "--format", "hf", "--ckpt", str(moved), "--out", str(tmp_path / "o")]) == 2
    finally:
        (tmp_path / "elsewhere.model").rename(tokenizer_file)
    assert capsys.readouterr().err.strip() == (
        "error: --ckpt: the model reads 400 tokens, not bytes, and its run holds no tokenizer (a PG-19 run keeps it as "
        "tokenizer.model in the run directory); put it back there, or export the weights alone with --format "
        "safetensors")
    assert not (tmp_path / "o").exists()


def fresh_python(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``code`` in a new Python process whose environment names nothing of this one (offline, one thread, its own
    transformers module cache); it must not have imported transformer_vq when it starts loading."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    prelude = "import sys\nassert not [m for m in sys.modules if m.startswith('transformer_vq')]\n"
    return subprocess.run([sys.executable, "-c", prelude + code, *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)


LOAD_AND_RESAVE = """
import torch
torch.set_num_threads(1)
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
source, again, x_file, out_file = sys.argv[1:]
tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
assert not [m for m in sys.modules if m.startswith('transformer_vq')], 'the tokenizer needs no library'
config = AutoConfig.from_pretrained(source, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True)
headless = AutoModel.from_pretrained(source, trust_remote_code=True)
x = torch.load(x_file)
with torch.no_grad():
    logits = model(x).logits
    assert torch.equal(headless(x).logits, logits)
model.save_pretrained(again)
tokenizer.save_pretrained(again)
torch.save({"logits": logits, "ids": tokenizer.encode("naïve\\n  x"), "config": type(config).__name__,
            "model": type(model).__name__, "bases": [c.__module__ for c in type(model).__mro__]}, out_file)
"""


def test_remote_code_loads_in_a_process_that_never_imported_the_library(trained_run, exported, tmp_path):
    torch.save(X, tmp_path / "x.pt")
    reference, _, _ = model_from_checkpoint(str(trained_run), device="cpu")
    with torch.no_grad():
        expected = reference(X).logits
    source = exported
    for step in ("export", "saved again"):  # a model loaded through its remote code saves a directory that loads
        again = tmp_path / f"again-{step.replace(' ', '-')}"
        done = fresh_python(LOAD_AND_RESAVE, tmp_path, str(source), str(again), str(tmp_path / "x.pt"),
                            str(tmp_path / "out.pt"))
        assert done.returncode == 0, f"{step}: {done.stderr}"
        out = torch.load(tmp_path / "out.pt")
        assert (out["config"], out["model"]) == ("TransformerVQHFConfig", "TransformerVQForCausalLM")
        assert "transformer_vq.hf.modeling" in out["bases"]  # the installed library's class, not a copy
        assert torch.equal(out["logits"], expected), step
        assert out["ids"] == encode_bytes("naïve\n  x")
        assert (again / "modeling_transformer_vq.py").read_bytes() == \
            (exported / "modeling_transformer_vq.py").read_bytes()
        source = again


def registered():
    return CONFIG_MAPPING[MODEL_TYPE], AutoModel._model_mapping[TransformerVQHFConfig], \
        AutoModelForCausalLM._model_mapping[TransformerVQHFConfig]


def test_remote_code_does_not_change_a_process_that_imported_the_library(trained_run, exported):
    reference, _, _ = model_from_checkpoint(str(trained_run), device="cpu")
    assert registered() == (TransformerVQHFConfig, TransformerVQForCausalLM, TransformerVQForCausalLM)
    assert isinstance(AutoConfig.from_pretrained(exported, trust_remote_code=True), TransformerVQHFConfig)
    assert type(AutoModelForCausalLM.from_pretrained(exported)) is TransformerVQForCausalLM  # no question asked
    # transformers 5.24 then uses the registered classes, 5.0 runs the directory's code: the same class
    model = AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True)
    assert isinstance(model, TransformerVQForCausalLM)
    with torch.no_grad():
        assert torch.equal(model(X).logits, reference(X).logits)
    assert registered() == (TransformerVQHFConfig, TransformerVQForCausalLM, TransformerVQForCausalLM)


def test_missing_library_is_named_with_its_install_command(exported, tmp_path):
    code = ("sys.modules['transformer_vq'] = None  # what import finds when the library is not installed\n"
            "from transformers import AutoModelForCausalLM\n"
            "AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n")
    done = fresh_python(code, tmp_path, str(exported))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: this model directory runs on the transformer-vq library, which could not "
                           "be imported (") and last.endswith("): install it with its extra hf (pip install -e "
                                                             "'.[hf]' in a checkout of it)"), last


LOAD_LOGITS = """
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
with torch.no_grad():
    torch.save(model(torch.load(sys.argv[2])).logits, sys.argv[3])
"""


def test_a_directory_saved_by_the_library_itself_stands_alone(tmp_path):
    """Not only tvq export: save_pretrained of the library's class writes the auto_map and the code it names."""
    from hfutil import tiny_model

    lib = tiny_model()
    saved = tmp_path / "saved"
    TransformerVQForCausalLM.from_library_model(lib).save_pretrained(saved)
    torch.save(X % 64, tmp_path / "x.pt")
    done = fresh_python(LOAD_LOGITS, tmp_path, str(saved), str(tmp_path / "x.pt"), str(tmp_path / "out.pt"))
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        assert torch.equal(torch.load(tmp_path / "out.pt"), lib(X % 64).logits)
