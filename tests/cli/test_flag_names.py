"""Every refusal names the flag the user typed (audit-cli F7, the whole class): a model field of a benchmark's cell, an
output path that cannot be written (checked before the work, by flag, with the one shared check), a flag that another
makes unused, and the out-of-memory hint of each command."""

from __future__ import annotations

import errno
import importlib

import pytest

from cliutil import error_line
from transformer_vq.cli import main
from transformer_vq.config import ConfigError


def test_a_cell_model_problem_names_the_model_flag_not_the_model_class(capsys):
    """Once ``--models: full/shga: invalid TransformerVQConfig: reduction ...``: a class name and no --reduction."""
    line = error_line(capsys, ["bench", "train", "--models", "vq/shga", "full/shga", "--reduction", "matmul"])
    assert line.startswith("error: --reduction: applies only with attn_type 'vq'")
    assert line.endswith("(in cell full/shga of --models)") and "Config" not in line


def test_a_nested_field_is_named_by_its_own_flag():
    from transformer_vq.bench.config import LongVQBenchConfig
    from transformer_vq.config.flags import flag_message

    err = ConfigError("invalid LongVQBenchConfig: ...", [("model.n_classes", "x"), ("lengths", "y"), (None, "z")],
                      LongVQBenchConfig)
    assert flag_message(err) == "--n-classes: x; --lengths: y; z"


def test_ablate_checks_eval_tokens_when_its_config_is_built():
    """As tvq train's config does: before the matrix, not as the TrainConfig of its first cell."""
    from transformer_vq.config.ablate import AblateConfig

    with pytest.raises(ConfigError) as caught:
        AblateConfig(matrix="codebook", eval_tokens=1)
    assert caught.value.problems[0][0] == "eval_tokens" and caught.value.cls is AblateConfig


@pytest.mark.parametrize("argv, message", [
    (["--cells", "S1", "S2"], "--cells: 'S1', 'S2' are not in matrix 'codebook' (S32, S64, S128, S256, S512)"),
    # once "matrix 'codebook', cell 'S32': unknown model preset 'bogus'"
    (["--preset", "bogus"], "--preset: must be one of enwik8, pg19, imagenet64, small, tiny, got 'bogus'"),
], ids=["cells", "preset"])
def test_ablate_names_its_flags(capsys, argv, message):
    assert error_line(capsys, ["ablate", "--matrix", "codebook", *argv]) == f"error: {message}"


def _write_probe_fails(monkeypatch):
    """Every directory refuses new files (a read-only disk; root on /proc): only a real write finds it out."""
    import tempfile

    def refused(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)


@pytest.mark.parametrize("argv, flag, where", [
    (["export", "--ckpt", "nowhere", "--out", "{file}/model"], "--out", "file"),
    (["tokenizer", "--data-path", "nowhere", "--out", "{file}/x.model"], "--out", "file"),
    (["tokenizer", "--data-path", "nowhere", "--cache-dir", "{file}"], "--cache-dir", "file"),
    (["classify", "eval", "--ckpt", "nowhere", "--plot", "{file}/c.png"], "--plot", "file"),
    (["export", "--ckpt", "nowhere", "--out", "{dir}/model"], "--out", "read-only"),
    (["tokenizer", "--data-path", "nowhere", "--out", "{dir}/x.model"], "--out", "read-only"),
    (["classify", "eval", "--ckpt", "nowhere", "--plot", "{dir}/c.png"], "--plot", "read-only"),
    (["codebook", "--ckpt", "nowhere", "--out", "{dir}"], "--out", "read-only"),
], ids=["export", "tokenizer-out", "tokenizer-cache-dir", "classify-plot", "export-read-only",
        "tokenizer-read-only", "classify-plot-read-only", "codebook-read-only"])
def test_an_output_path_that_cannot_be_written_is_refused_by_flag_first(capsys, tmp_path, monkeypatch, argv, flag,
                                                                        where):
    """Before the checkpoint or the data is read (none exists here): once an OSError naming a temporary file and no
    flag, after the work (export: ``No such file or directory: /proc/.nope.x1y2.tmp; check the path``)."""
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "d").mkdir()
    argv = [word.format(file=tmp_path / "f.txt", dir=tmp_path / "d") for word in argv]
    if where == "read-only":
        _write_probe_fails(monkeypatch)
        message = f"error: {flag}: cannot write in {tmp_path / 'd'} (Read-only file system); choose another path"
    else:
        message = f"error: {flag}: {tmp_path / 'f.txt'} is a file, not a directory; remove it or choose another path"
    assert error_line(capsys, argv) == message


def test_tokenizer_refuses_a_cache_dir_that_out_leaves_unused(capsys, tmp_path):
    """Once the model went to --out and --cache-dir was ignored in silence."""
    line = error_line(capsys, ["tokenizer", "--data-path", "nowhere", "--out", "x.model", "--cache-dir", "c"])
    assert line.startswith("error: --cache-dir: the model is saved at --out x.model, so the cache is not used")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("argv, hint", [
    (["sample", "--ckpt", "x"], "use fewer --num-samples (an image model's batch) or a shorter --prompt"),
    (["classify", "eval", "--ckpt", "x"], "use a smaller --batch-size (tvq classify train: or --eval-batch-size)"),
])
def test_out_of_memory_names_the_flags_of_sample_and_classify(monkeypatch, capsys, argv, hint):
    """Not training's "batch_size or seq_len", which neither command has as a flag."""
    def run(args):
        raise MemoryError

    monkeypatch.setattr(importlib.import_module(f"transformer_vq.cli.{argv[0]}"), "run", run)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"error: out of memory; {hint}")
