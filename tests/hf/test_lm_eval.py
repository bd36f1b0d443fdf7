"""lm-eval, run as its users run it (the `lm_eval` command, `--model hf` with trust_remote_code), on an exported run:
its bits per byte are `tvq eval`'s on the same bytes, and batch 4 (unequal lengths: right-padded scoring, left-padded
generation) gives what batch 1 gives, which is the library's greedy generation.

The tasks are local: YAML files in a temporary --include_path over JSONL files (written as JSON, which YAML reads).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("lm_eval") is None:
    pytest.skip("needs lm-eval: pip install -e '.[eval]'", allow_module_level=True)
pytest.importorskip("transformers")

from transformers import AutoTokenizer  # noqa: E402

from transformer_vq.cli import main  # noqa: E402
from transformer_vq.data.codec import encode_bytes  # noqa: E402
from transformer_vq.train.lm.build import model_from_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# What tvq eval and lm-eval both score: ASCII, UTF-8 of two to four bytes, newlines, runs of spaces, a tab.
TEXT = ("The king shall speak:  \"naïve café, ½ — ☃ 日本語 🎉\"\n\n   good   night,\tmy lord;\n"
        "and thee of love and war.\n") * 6
# Documents of unequal lengths (TEXT[1:] among them) and prompts of unequal lengths, for the batch comparison
DOCUMENTS = [TEXT[1:], "short one.", "a   middling document\nwith two lines, ünïcödé", "x" * 50 + " end", "good night"]
PROMPTS = ["the king", "my lord; good night.\nthe", "war, ", "love and war, my lord; good", "t"]
MAX_GEN_TOKS = 12
UNTIL = ["\n\n"]


def task(name: str, rows: list[dict], data: Path, **spec) -> dict:
    """An lm-eval task over ``rows`` (written to ``data``)."""
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test", "metadata": {"version": 1.0}, **spec}


ROLLING = {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
           "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}, {"metric": "bits_per_byte"}]}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """The --include_path: tvq_bpb (TEXT after its first byte), tvq_rolling (DOCUMENTS), tvq_generate (PROMPTS)."""
    root = tmp_path_factory.mktemp("tasks")
    specs = [task("tvq_bpb", [{"text": TEXT[1:]}], root / "bpb.jsonl", **ROLLING),
             task("tvq_rolling", [{"text": doc} for doc in DOCUMENTS], root / "rolling.jsonl", **ROLLING),
             task("tvq_generate", [{"prompt": p, "target": " shall"} for p in PROMPTS], root / "generate.jsonl",
                  output_type="generate_until", doc_to_text="{{prompt}}", doc_to_target="{{target}}",
                  generation_kwargs={"until": UNTIL, "max_gen_toks": MAX_GEN_TOKS, "do_sample": False},
                  metric_list=[{"metric": "exact_match"}])]
    for spec in specs:
        (root / f"{spec['task']}.yaml").write_text(json.dumps(spec, indent=2))
    return root


def lm_eval(exported: Path, tasks: Path, batch_size: int, out: Path) -> tuple[dict, dict]:
    """Run the lm_eval command; returns (results by task, samples by task and doc id)."""
    # The model has no beginning-of-text token: each document is scored after TEXT's first byte, as tvq eval scores
    # a split after its first byte.
    model_args = f"pretrained={exported},trust_remote_code=True,dtype=float32,prefix_token_id={TEXT.encode()[0]}"
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(out),
           "HF_HOME": str(out / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", model_args,
                           "--tasks", "tvq_bpb,tvq_rolling,tvq_generate", "--include_path", str(tasks),
                           "--batch_size", str(batch_size), "--device", "cpu", "--log_samples",
                           "--output_path", str(out / "results")],
                          capture_output=True, text=True, timeout=600, cwd=out, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (results_file,) = (out / "results").rglob("results_*.json")
    samples = {}
    for path in (out / "results").rglob("samples_*.jsonl"):
        name = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        samples[name] = {row["doc_id"]: row["resps"] for row in rows}
    return json.loads(results_file.read_text())["results"], samples


@pytest.fixture(scope="module")
def runs(exported, tasks, tmp_path_factory) -> dict[int, tuple[dict, dict]]:
    return {batch: lm_eval(exported, tasks, batch, tmp_path_factory.mktemp(f"batch{batch}")) for batch in (1, 4)}


def test_bits_per_byte_is_tvq_evals(trained_run, runs, tmp_path, capsys):
    # tvq eval scores a text run's validation split: a corpus file whose validation 5% is exactly TEXT
    text = TEXT.encode()
    filler = (b"the king shall speak to thee of love and war, my lord; good night.\n" * 600)[:18 * len(text)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(filler + text + filler[:len(text)])
    # lm-eval scores the whole document in one call: tvq eval with the state carried across the whole stream
    assert main(["eval", "--ckpt", str(trained_run), "--data-path", str(corpus), "--split", "validation",
                 "--streams", "1", "--carry-tokens", "0", "--json"]) == 0
    tvq = json.loads(capsys.readouterr().out)
    assert tvq["tokens"] == len(text) - 1  # every byte after the first
    results, _ = runs[1]
    assert results["tvq_bpb"]["bits_per_byte,none"] == pytest.approx(tvq["bits_per_byte"], rel=1e-6, abs=0)
    assert results["tvq_bpb"]["byte_perplexity,none"] == pytest.approx(2 ** tvq["bits_per_byte"], rel=1e-6, abs=0)
    assert math.isfinite(results["tvq_bpb"]["word_perplexity,none"])


def test_batch_of_four_scores_what_batch_of_one_scores(runs):
    (results_1, samples_1), (results_4, samples_4) = runs[1], runs[4]
    assert samples_4["tvq_rolling"] == samples_1["tvq_rolling"]  # every document's log-likelihood, bitwise
    assert results_4["tvq_rolling"] == results_1["tvq_rolling"]


def test_batch_of_four_generates_what_batch_of_one_and_the_library_generate(trained_run, exported, runs):
    model, _, _ = model_from_checkpoint(str(trained_run), device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(exported, trust_remote_code=False)
    expected = {}
    for doc_id, prompt in enumerate(PROMPTS):
        ids = encode_bytes(prompt)
        with torch.no_grad():
            new = model.generate(torch.tensor([ids]), MAX_GEN_TOKS, temperature=0)[0, len(ids):].tolist()
        if tokenizer.eos_token_id in new:  # lm-eval stops at the end-of-text token (byte 0)
            new = new[:new.index(tokenizer.eos_token_id)]
        text = tokenizer.decode(new, skip_special_tokens=True)
        for stop in UNTIL:
            text = text.split(stop)[0]
        expected[doc_id] = [[text]]
    assert runs[1][1]["tvq_generate"] == expected
    assert runs[4][1]["tvq_generate"] == expected
