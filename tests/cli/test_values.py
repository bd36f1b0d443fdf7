"""Values: every flag refuses what it cannot use (non-finite, overflowing, empty, out of range, unknown words,
combinations the model cannot run) with one line `error: --FLAG: ...` and exit status 2, before any work."""

from __future__ import annotations

import dataclasses

import pytest

from cliutil import error_line, tiny_train

from transformer_vq.config import TransformerVQConfig

# every model field, in the order the error message lists them
MODEL_KEYS = ", ".join(sorted(f.name for f in dataclasses.fields(TransformerVQConfig)))

FINITE = "must be a finite number"
NAME_RULE = "must name one directory (not empty, '.' or '..', without '/')"

# (flags given after a complete tiny `tvq train` command, the error line)
TRAIN = {
    "lr-inf": (["--lr", "inf"], f"--lr: {FINITE}, got 'inf'"),
    "lr-nan": (["--lr", "nan"], f"--lr: {FINITE}, got 'nan'"),
    "lr-negative": (["--lr", "-1"], "--lr: must be > 0, got '-1'"),
    "lr-zero": (["--lr", "0"], "--lr: must be > 0, got '0'"),
    "lr-overflow": (["--lr", "1e400"], "--lr: is too large (overflows a float), got '1e400'"),
    "lr-word": (["--lr", "abc"], "--lr: must be a number, got 'abc'"),
    "lr-empty": (["--lr", ""], "--lr: must be a number, got ''"),
    "steps-zero": (["--steps", "0"], "--steps: must be a positive integer, got '0'"),
    "steps-negative": (["--steps", "-1"], "--steps: must be a positive integer, got '-1'"),
    "steps-fraction": (["--steps", "1.5"], "--steps: must be an integer (digits only, without a decimal point or "
                                           "exponent), got '1.5'"),
    "steps-exponent": (["--steps", "1e400"], "--steps: must be an integer (digits only, without a decimal point or "
                                             "exponent), got '1e400'"),
    "steps-overflow": (["--steps", "99999999999999999999999"],
                       "--steps: is too large (at most 9223372036854775807), got '99999999999999999999999'"),
    "steps-empty": (["--steps", ""], "--steps: must be an integer, got ''"),
    "batch-size-zero": (["--batch-size", "0"], "--batch-size: must be a positive integer, got '0'"),
    "seq-len-not-multiple": (["--seq-len", "40"], "--seq-len: must be a multiple of update_len=16 (e.g. 32), got 40"),
    "update-len-not-multiple": (["--update-len", "12", "--seq-len", "36"],
                                "--update-len: must be a multiple of the model's block_len=8 (e.g. 8, or change "
                                "block_len), got 12"),
    "block-len-zero": (["--block-len", "0"], "--block-len: must be a positive integer, got '0'"),
    "n-code-zero": (["--n-code", "0"], "--n-code: must be a positive integer, got '0'"),
    "d-model-odd": (["--d-model", "31"], "--d-model: must be even (sinusoid tables pair sin and cos), got 31"),
    "n-head-with-shga": (["--n-head", "2"], "--n-head: must be 1 for head_type 'shga' (use 'mqa' or 'mha'), got 2"),
    "d-v-not-divisible": (["--head-type", "mha", "--n-head", "4", "--d-v", "30"],
                          "--d-v: must be divisible by n_head=4, got 30"),
    "dropsin-one": (["--dropsin", "1.0"], "--dropsin: must be in [0, 1), got '1.0'"),
    "dropsin-negative": (["--dropsin", "-0.1"], "--dropsin: must be in [0, 1), got '-0.1'"),
    "dropsin-nan": (["--dropsin", "nan"], f"--dropsin: {FINITE}, got 'nan'"),
    "dropres-minus-inf": (["--dropres=-inf"], f"--dropres: {FINITE}, got '-inf'"),
    "ema-rate-one": (["--ema-rate", "1"], "--ema-rate: must be in (0, 1), got '1'"),
    "ema-rate-nan": (["--ema-rate", "nan"], f"--ema-rate: {FINITE}, got 'nan'"),
    "commit-coef-negative": (["--commit-coef", "-1"], "--commit-coef: must be >= 0, got '-1'"),
    "commit-coef-inf": (["--commit-coef", "inf"], f"--commit-coef: {FINITE}, got 'inf'"),
    "weight-decay-inf": (["--weight-decay", "inf"], f"--weight-decay: {FINITE}, got 'inf'"),
    "final-lr-ratio-two": (["--final-lr-ratio", "2"], "--final-lr-ratio: must be in [0, 1], got '2'"),
    "grad-clip-nan": (["--grad-clip", "nan"], f"--grad-clip: {FINITE}, got 'nan'"),
    "warmup-steps-negative": (["--warmup-steps", "-1"], "--warmup-steps: must be an integer >= 0, got '-1'"),
    "eval-tokens-one": (["--eval-tokens", "1"], "--eval-tokens: must be 0 (all) or at least 2 (a token is scored "
                                                "from the one before it), got 1"),
    "keep-ckpts-zero": (["--keep-ckpts", "0"], "--keep-ckpts: must be a positive integer, got '0'"),
    "attn-type-unknown": (["--attn-type", "foo"], "--attn-type: must be one of vq, full, flash_quad, flash, got 'foo'"),
    "head-type-unknown": (["--head-type", "foo"], "--head-type: must be one of shga, mqa, mha, got 'foo'"),
    "reduction-unknown": (["--reduction", "foo"], "--reduction: must be one of serial, matmul, assoc, got 'foo'"),
    "optimizer-unknown": (["--optimizer", "sgd"], "--optimizer: must be one of adamw, adafactor, got 'sgd'"),
    "precision-unknown": (["--precision", "fp16"], "--precision: must be one of float32, bfloat16, got 'fp16'"),
    "preset-unknown": (["--preset", "gpt2"], "--preset: must be one of enwik8, pg19, imagenet64, small, tiny, got "
                                             "'gpt2'"),
    "max-wavelength-one": (["--max-wavelength", "1"], "--max-wavelength: must be > 1, got '1'"),
    "max-wavelength-inf": (["--max-wavelength", "inf"], f"--max-wavelength: {FINITE}, got 'inf'"),
    "seed-negative": (["--seed", "-1"], "--seed: must be an integer >= 0, got '-1'"),
    "seed-2-64": (["--seed", str(2**64)], f"--seed: is too large (at most 9223372036854775807), got '{2**64}'"),
    "threads-negative": (["--threads", "-1"], "--threads: must be in [0, 1024], got '-1'"),
    "set-lr-inf": (["--set", "lr=inf"], f"--lr: {FINITE}, got 'inf'"),
    "set-empty-value": (["--set", "model.block_len="], "--block-len: must be an integer, got ''"),
    "set-model-unknown-key": (["--set", "model.nope=1"], "unknown model config key(s): nope; known keys: "
                              + MODEL_KEYS),
    "lr-underflow": (["--lr", "1e-400"], "--lr: is too small (underflows to 0), got '1e-400'"),
    "set-without-equals": (["--set", "foo"], "--set: 'foo' must look like KEY=VALUE, e.g. --set steps=100"),
    "set-unknown-section": (["--set", "unknown.key=1"], "--set: unknown config section 'unknown' in "
                                                        "'unknown.key=1'; use model.FIELD or train.FIELD"),
    "unknown-flag": (["--bogus"], "unrecognized arguments: --bogus; see tvq train --help"),
    # read on a CPU only: on a GPU it did nothing (refused before any device is asked for, so this runs anywhere)
    "host-memory-on-cuda": (["--device", "cuda", "--no-retain-host-memory"],
                            "--retain-host-memory: applies only with device 'auto' or 'cpu' (this run has device "
                            "'cuda'), got False; leave it out, or set device as it needs"),
}

# (a command on the session's trained run, the error line)
JOBS = {
    "eval-max-tokens-negative": (["eval", "--max-tokens", "-5"], "--max-tokens: must be an integer >= 0, got '-5'"),
    "eval-max-tokens-one": (["eval", "--max-tokens", "1"], "--max-tokens: must be 0 (all) or at least 2 (a token is "
                                                           "scored from the one before it), got 1"),
    "eval-streams-zero": (["eval", "--streams", "0"], "--streams: must be a positive integer, got '0'"),
    "eval-window-len-zero": (["eval", "--window-len", "0"], "--window-len: must be a positive integer, got '0'"),
    "eval-split-unknown": (["eval", "--split", "foo"], "--split: must be one of train, validation, test, got 'foo'"),
    "sample-temperature-underflow": (["sample", "--temperature", "1e-400"],
                                     "--temperature: is too small (underflows to 0), got '1e-400'"),
    "sample-temperature-negative": (["sample", "--temperature", "-1"], "--temperature: must be >= 0, got '-1'"),
    "sample-temperature-inf": (["sample", "--temperature", "inf"], f"--temperature: {FINITE}, got 'inf'"),
    "sample-temperature-nan": (["sample", "--temperature", "nan"], f"--temperature: {FINITE}, got 'nan'"),
    "sample-top-p-zero": (["sample", "--top-p", "0"], "--top-p: must be in (0, 1], got '0'"),
    "sample-top-p-above-one": (["sample", "--top-p", "1.5"], "--top-p: must be in (0, 1], got '1.5'"),
    "sample-top-p-nan": (["sample", "--top-p", "nan"], f"--top-p: {FINITE}, got 'nan'"),
    "sample-top-k-negative": (["sample", "--top-k", "-1"], "--top-k: must be an integer >= 0, got '-1'"),
    "sample-max-new-tokens-negative": (["sample", "--max-new-tokens", "-1"],
                                       "--max-new-tokens: must be an integer >= 0, got '-1'"),
    "sample-prompt-empty": (["sample", "--prompt", ""], "--prompt: must not be empty, got ''"),
    "sample-num-samples-zero": (["sample", "--num-samples", "0"], "--num-samples: must be a positive integer, got '0'"),
    # greedy text draws nothing: the seed would change nothing (an image model's first subpixel takes it)
    "sample-seed-greedy": (["sample", "--temperature", "0", "--seed", "5"],
                           "--seed: applies only with temperature above 0, or to an image model (this run has "
                           "temperature 0.0 and data 'text'), got 5; leave it out, or set temperature as it needs"),
}

# (a `tvq bench op`, `tvq tokenizer` or `tvq demo` command, the error line): refused before any cell runs or file is
# written
TOOLS = {
    "bench-lengths-zero": (["bench", "op", "--lengths", "0"], "--lengths: must be a positive integer, got '0'"),
    "bench-lengths-negative": (["bench", "op", "--lengths", "-1"], "--lengths: must be a positive integer, got '-1'"),
    "bench-lengths-word": (["bench", "op", "--lengths", "abc"], "--lengths: must be an integer, got 'abc'"),
    "bench-repeats-zero": (["bench", "op", "--repeats", "0"], "--repeats: must be a positive integer, got '0'"),
    "bench-budget-zero": (["bench", "op", "--budget-s", "0"], "--budget-s: must be > 0, got '0'"),
    "bench-budget-inf": (["bench", "op", "--budget-s", "inf"], f"--budget-s: {FINITE}, got 'inf'"),
    "bench-methods-unknown": (["bench", "op", "--methods", "foo"], "--methods: must be one of vq-serial, vq-matmul, "
                                                                   "vq-assoc, vq-triton, vq-qk, sdpa, full, flash, "
                                                                   "flash_quad, vq-bidir, vq-qk-bidir, sdpa-bidir, "
                                                                   "got 'foo'"),
    "tokenizer-vocab-size-zero": (["tokenizer", "--data-path", ".", "--vocab-size", "0"],
                                  "--vocab-size: must be >= 300, got '0'"),
    "tokenizer-vocab-size-word": (["tokenizer", "--data-path", ".", "--vocab-size", "abc"],
                                  "--vocab-size: must be an integer, got 'abc'"),
    "tokenizer-threads-negative": (["tokenizer", "--data-path", ".", "--threads", "-1"],
                                   "--threads: must be in [1, 1024], got '-1'"),
    "tokenizer-without-data-path": (["tokenizer"], "--data-path: is required: pass the PG-19 root directory"),
    "tokenizer-threads-huge": (["tokenizer", "--data-path", ".", "--threads", "100000"],
                               "--threads: must be in [1, 1024], got '100000'"),
    "demo-preset-unknown": (["demo", "--preset", "bogus"],
                            "--preset: must be one of enwik8, pg19, imagenet64, small, tiny, got 'bogus'"),
    # a flag no cell reads is named as that, not by what the model's checks make of its value
    "bench-longvq-unread-field": (["bench", "longvq", "--n-classes", "0", "--no-isolate"],
                                  "--n-classes: tvq bench longvq times one block on random embeddings, which this "
                                  "field does not change"),
    # ablate's own flags are named, not the TrainConfig of a cell the user never typed
    "ablate-eval-tokens-one": (["ablate", "--matrix", "codebook", "--eval-tokens", "1"],
                               "--eval-tokens: must be 0 (all) or at least 2 (a token is scored from the one before "
                               "it), got 1"),
    "ablate-seq-len-not-multiple": (["ablate", "--matrix", "codebook", "--seq-len", "100", "--update-len", "30"],
                                    "--seq-len: must be a multiple of update_len=30 (e.g. 90), got 100"),
    # a corpus that cannot load is refused once, before any cell (it failed in every cell, the class path shown)
    "ablate-text-without-path": (["ablate", "--matrix", "codebook", "--data", "text"],
                                 "--data text needs a file or directory: pass --data-path FILE_OR_DIR"),
    "ablate-set-bad-value": (["ablate", "--matrix", "codebook", "--set", "d_model=33"],
                             "matrix 'codebook', cell 'S32': --set d_model=33: must be even (sinusoid tables pair sin "
                             "and cos), got 33"),
    "demo-seed-negative": (["demo", "--seed", "-1"], "--seed: must be an integer >= 0, got '-1'"),
    "demo-seed-2-64": (["demo", "--seed", str(2**64)], f"--seed: is too large (at most 9223372036854775807), got "
                                                       f"'{2**64}'"),
}


@pytest.mark.parametrize("flags, message", TRAIN.values(), ids=TRAIN.keys())
def test_train_values(capsys, corpus, tmp_path, flags, message):
    assert error_line(capsys, tiny_train(corpus, tmp_path / "run", *flags)) == f"error: {message}"
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.parametrize("argv, message", JOBS.values(), ids=JOBS.keys())
def test_eval_and_sample_values(capsys, trained, argv, message):
    assert error_line(capsys, [*argv, "--ckpt", str(trained)]) == f"error: {message}"


@pytest.mark.parametrize("argv, message", TOOLS.values(), ids=TOOLS.keys())
def test_bench_and_tokenizer_values(capsys, tmp_path, argv, message):
    assert error_line(capsys, argv) == f"error: {message}"
    assert list(tmp_path.iterdir()) == []  # no result files


def test_under_torchrun_only_rank_0_prints_a_config_error(capsys, corpus, tmp_path, monkeypatch):
    """A refused flag is refused by every worker alike: one line says it, not one per worker; every worker exits 2,
    the others after a wait, for torchrun stops every worker once one exits (rank 0 was stopped before it spoke). A
    worker that torchrun did not stop in the wait says it too: rank 0 did not exit, the error was this worker's."""
    import transformer_vq.cli as cli

    argv = tiny_train(corpus, tmp_path / "run", "--seq-len", "30")
    monkeypatch.setenv("RANK", "1")
    waits = []  # each wait, with what had been said before it
    monkeypatch.setattr(cli.time, "sleep", lambda seconds: waits.append((seconds, capsys.readouterr().err)))
    monkeypatch.setattr("transformer_vq.train.signals.stop_with_parent", lambda: None)  # no watch on pytest's parent
    said = "error: --seq-len: must be a multiple of update_len"
    # RANK alone is not torchrun: a scheduler's pod or a launcher's shell sets it for a process with its own log
    assert error_line(capsys, argv).startswith(said) and waits == []
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun sets it for every worker it starts
    assert error_line(capsys, argv).startswith(said) and waits == [(cli.QUIET_RANK_WAIT_S, "")]
    monkeypatch.setenv("RANK", "0")
    assert error_line(capsys, argv).startswith(said)
