"""The flags generated from the config dataclasses: every field is a typed flag, values are refused while parsing
with one line naming the flag, sources are applied in a fixed order, and errors reach the user as one line."""

from __future__ import annotations

import dataclasses
import errno
import subprocess
import sys

import pytest

from transformer_vq.cli import build_parser, main
from transformer_vq.config import (ConfigError, EvalConfig, SampleConfig, TrainConfig, TransformerVQConfig,
                                  parse_data_options)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


def help_text(capsys, *command: str) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_every_model_and_train_field_is_a_flag_of_train_with_its_help(capsys):
    text = help_text(capsys, "train")
    squeezed = "".join(text.split())  # help lines wrap at spaces and hyphens
    for cls in (TransformerVQConfig, TrainConfig):
        for field in dataclasses.fields(cls):
            flag = "--" + field.metadata.get("flag", field.name.replace("_", "-"))
            assert flag in text, flag
            assert "".join(field.metadata["help"].split()) in squeezed, field.name
    assert "--abs-pos, --no-abs-pos" in text and "--attn-type {vq,full,flash_quad,flash}" in text
    assert "--lr X|none" in text


@pytest.mark.parametrize("command, cls", [("eval", EvalConfig), ("sample", SampleConfig)])
def test_eval_and_sample_flags_are_their_config_fields(capsys, command, cls):
    text = help_text(capsys, command)
    for field in dataclasses.fields(cls):
        assert "--" + field.metadata.get("flag", field.name.replace("_", "-")) in text


def test_help_does_not_import_torch():
    code = "import sys; from transformer_vq.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_flags_are_typed_values():
    from transformer_vq.cli.train import build_config

    args = build_parser().parse_args(["train", "--preset", "tiny", "--block-len", "4", "--attn-type", "full",
                                      "--abs-pos", "--lr", "none", "--dropres", "0.25", "--steps", "7",
                                      "--data-path", "x.txt", "--data", "text"])
    cfg = build_config(args)
    assert (cfg.model.block_len, cfg.model.attn_type, cfg.model.abs_pos, cfg.model.dropres) == (4, "full", True, 0.25)
    assert (cfg.train.lr, cfg.train.steps, cfg.train.data_path, cfg.train.data) == (None, 7, "x.txt", "text")
    args = build_parser().parse_args(["train", "--preset", "imagenet64", "--no-abs-pos", "--update-len", "512",
                                      "--seq-len", "512"])
    assert build_config(args).model.abs_pos is False


def test_precedence_preset_file_set_flags(tmp_path):
    from transformer_vq.cli.train import build_config

    path = tmp_path / "run.yaml"
    path.write_text("preset: tiny\nmodel:\n  n_layers: 2\n  n_code: 4\ntrain:\n  steps: 50\n  seed: 5\n")

    def cfg(*argv):
        return build_config(build_parser().parse_args(["train", "--config", str(path), *argv]))

    base = cfg()
    assert (base.model.d_model, base.model.n_layers, base.model.n_code, base.train.steps) == (32, 2, 4, 50)
    with_set = cfg("--set", "n_layers=3", "--set", "steps=60")
    assert (with_set.model.n_layers, with_set.train.steps, with_set.train.seed) == (3, 60, 5)
    flags = cfg("--set", "n_layers=3", "--set", "steps=60", "--n-layers", "4", "--steps", "70")
    assert (flags.model.n_layers, flags.model.n_code, flags.train.steps) == (4, 4, 70)
    assert cfg("--preset", "small").model.d_model == 256  # an explicit preset wins over the file's


def test_resume_continues_the_saved_config_with_flags_on_top(tmp_path):
    from transformer_vq.cli.train import build_config
    from transformer_vq.config import load_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = load_config("tiny", values={"model": {"n_layers": 2}, "train": {"steps": 40, "run_dir": str(run_dir)}})
    (run_dir / "config.json").write_text(saved.to_json())
    cfg = build_config(build_parser().parse_args(["train", "--resume", "--run-dir", str(run_dir), "--steps", "80"]))
    assert (cfg.model, cfg.train.steps) == (saved.model, 80)


@pytest.mark.parametrize("argv, message", [
    (["train", "--lr", "inf"], "error: --lr: must be a finite number, got 'inf'"),
    (["train", "--lr", "nan"], "error: --lr: must be a finite number, got 'nan'"),
    (["train", "--lr", "1e400"], "error: --lr: is too large (overflows a float), got '1e400'"),
    (["train", "--lr", ""], "error: --lr: must be a number, got ''"),
    (["train", "--dropres=-inf"], "error: --dropres: must be a finite number, got '-inf'"),
    (["train", "--steps", "1e400"], "error: --steps: must be an integer (digits only, without a decimal point or "
                                    "exponent), got '1e400'"),
    (["train", "--batch-size", "99999999999999999999999"],
     "error: --batch-size: is too large (at most 9223372036854775807), got '99999999999999999999999'"),
    (["train", "--steps", ""], "error: --steps: must be an integer, got ''"),
    # once a segfault or "can't start new thread" (helper-72 audit-cli F1), in every command that computes
    (["train", "--threads", "100000"], "error: --threads: must be in [0, 1024], got '100000'"),
    (["eval", "--threads", "100000"], "error: --threads: must be in [0, 1024], got '100000'"),
    (["classify", "train", "--threads", "2000"], "error: --threads: must be in [0, 1024], got '2000'"),
    (["ablate", "--threads", "5000"], "error: --threads: must be in [0, 1024], got '5000'"),
    (["train", "--data", ""], "error: --data: must not be empty, got ''"),
    (["train", "--name", ""], "error: --name: must not be empty, got ''"),
    (["train", "--name", "."], "error: --name: must name one directory (not empty, '.' or '..', without '/'), "
                               "got '.'"),
    (["train", "--name", ".."], "error: --name: must name one directory (not empty, '.' or '..', without '/'), "
                                "got '..'"),
    (["train", "--name", "a/b"], "error: --name: must name one directory (not empty, '.' or '..', without '/'), "
                                 "got 'a/b'"),
    (["train", "--attn-type", "linear"], "error: --attn-type: must be one of vq, full, flash_quad, flash, got "
                                         "'linear'"),
    (["train", "--device", "tpu"], "error: --device: must be one of auto, cpu, cuda, got 'tpu'"),
    (["train", "--preset", "gpt2"], "error: --preset: must be one of enwik8, pg19, imagenet64, small, tiny, got "
                                    "'gpt2'"),
    (["train", "--set", "lr=inf"], "error: --lr: must be a finite number, got 'inf'"),
    (["train", "--set", "data_path="], "error: --data-path: must not be empty, got ''"),
    (["train", "--data-path", "notes.txt"], "error: --data-path: name the corpus it holds with --data (text for "
                                            "your own text file or directory; shakespeare, enwik8, pg19, imagenet64 "
                                            "or gcide for a downloaded copy)"),
    (["eval", "--max-tokens", "-5"], "error: --max-tokens: must be an integer >= 0, got '-5'"),
    (["eval", "--streams", "0"], "error: --streams: must be a positive integer, got '0'"),
    (["sample", "--temperature", "1e-400"], "error: --temperature: is too small (underflows to 0), got '1e-400'"),
    (["sample", "--temperature", "-1"], "error: --temperature: must be >= 0, got '-1'"),
    (["sample", "--top-p", "0"], "error: --top-p: must be in (0, 1], got '0'"),
    (["sample", "--top-p", "1.5"], "error: --top-p: must be in (0, 1], got '1.5'"),
    (["sample", "--top-k", "-1"], "error: --top-k: must be an integer >= 0, got '-1'"),
    (["sample", "--max-new-tokens", "-1"], "error: --max-new-tokens: must be an integer >= 0, got '-1'"),
    (["sample", "--prompt", ""], "error: --prompt: must not be empty, got ''"),
    (["bench", "op", "--out", "   "], "error: --out: must not be empty, got '   '"),  # a line, its value as given
    (["train", "--bogus"], "error: unrecognized arguments: --bogus; see tvq train --help"),
])
def test_bad_values_exit_2_with_one_line(capsys, argv, message):
    assert exit_code(argv) == 2
    assert capsys.readouterr().err == message + "\n"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["train", "eval", "sample"])
def test_cuda_without_a_gpu(capsys, command):
    assert exit_code([command, "--device", "cuda"]) == 2
    assert capsys.readouterr().err == ("error: --device: cuda was requested but no CUDA GPU is available; use "
                                       "--device cpu (or auto)\n")


LOST_PEER = ("another worker of this torchrun run stopped (it failed or was killed: the connection to it closed); "
             "torchrun's report names it; the last checkpoint resumes with --resume auto")


@pytest.mark.parametrize("error, message", [
    (OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoints"),
     "error: No space left on device: /runs/x/checkpoints; free some space or write elsewhere (e.g. --run-dir on "
     "another disk)"),
    (PermissionError(errno.EACCES, "Permission denied", "/runs"),
     "error: Permission denied: /runs; check the permissions, or write elsewhere (e.g. --run-dir)"),
    (OSError(errno.EROFS, "Read-only file system", "/mnt/ro"),
     "error: Read-only file system: /mnt/ro; the file system is read-only; write elsewhere (e.g. --run-dir)"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/runs/file/x"),
     "error: Not a directory: /runs/file/x; a part of the path is a file, not a directory; choose another path"),
    (MemoryError(), "error: out of memory; use a smaller model, batch_size or seq_len, or a machine with more memory"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
                  "allocate 1099511627776 bytes. can't allocate memory"),
     "error: out of memory (tried to allocate 1099511627776 bytes); use a smaller model, batch_size or seq_len, or "
     "a device with more memory"),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total capacity)"),
     "error: out of memory (tried to allocate 20.00 GiB); use a smaller model, batch_size or seq_len, or a device "
     "with more memory"),
    (RuntimeError("Found no NVIDIA driver on your system."), "error: CUDA is not usable on this machine; use --device "
                                                             "cpu"),
    # a collective after another worker died (helper-73 audit-dist2 F1: once a 40-line traceback per survivor)
    (RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:53989"), "error: " + LOST_PEER),
    (__import__("torch").distributed.DistBackendError("NCCL communicator was aborted on rank 1."),
     "error: " + LOST_PEER),
])
def test_environment_problems_are_one_line(monkeypatch, capsys, error, message):
    import transformer_vq.cli.version as version

    def run(args):
        raise error

    monkeypatch.setattr(version, "run", run)
    assert main(["version"]) == 2
    assert capsys.readouterr().err == message + "\n"


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly():
    """``tvq sample ... | head`` printed a BrokenPipeError traceback and exited 1 (helper-77 audit-classify F7): now
    the shell's own 141 and nothing on stderr, whichever command was writing."""
    import subprocess
    import sys

    writer = ("import sys, transformer_vq.cli as cli, transformer_vq.cli.version as v\n"
              "v.run = lambda args: [sys.stdout.write('x' * 1000 + '\\n') for _ in range(10 ** 5)]\n"
              "sys.exit(cli.main(['version']))\n")
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # the reader leaves, as head does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


@pytest.mark.parametrize("command, hint", [
    ("demo", "use a smaller --length or --preset"),  # helper-72 audit-cli F7: once training's batch_size or seq_len
    ("eval", "use a smaller --window-len or fewer --streams"),
    ("train", "use a smaller model (--preset, --d-model, --n-layers), --batch-size or --update-len"),
    ("version", "use a smaller model, batch_size or seq_len"),  # a command without a hint of its own
])
def test_out_of_memory_names_what_the_command_itself_can_change(monkeypatch, capsys, command, hint):
    import importlib

    def run(args):
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 800 bytes. can't allocate "
                           "memory")

    monkeypatch.setattr(importlib.import_module(f"transformer_vq.cli.{command}"), "run", run)
    main([command, "--ckpt", "x"] if command == "eval" else [command])
    assert capsys.readouterr().err.startswith(f"error: out of memory (tried to allocate 800 bytes); {hint}")


@pytest.mark.parametrize("number, words", [(errno.EROFS, "Read-only file system"), (errno.ENOSPC, "No space left on "
                                             "device"), (errno.EACCES, "Permission denied")])
def test_a_failing_write_in_the_data_cache_names_the_variable_that_moves_it(monkeypatch, capsys, tmp_path, number,
                                                                            words):
    """--run-dir does not move the data cache (helper-74 audit-data F6): a write there names TVQ_CACHE_DIR."""
    import transformer_vq.cli.version as version

    monkeypatch.setenv("TVQ_CACHE_DIR", str(tmp_path / "cache"))
    where = tmp_path / "cache" / "text" / ".0123.bin.x.tmp"

    def run(args):
        raise OSError(number, words, str(where))

    monkeypatch.setattr(version, "run", run)
    assert main(["version"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {words}: {where}; ") and "TVQ_CACHE_DIR, the data cache's directory" in err
    assert "--run-dir" not in err


def test_bugs_keep_their_traceback(monkeypatch):
    import transformer_vq.cli.version as version

    monkeypatch.setattr(version, "run", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["version"])
    monkeypatch.setattr(version, "run", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["version"]) == 130


def test_no_parser_accepts_an_abbreviated_option(capsys):
    """An abbreviation unique today becomes ambiguous, or means another option, when a flag is added: refused."""
    import argparse

    from transformer_vq.cli import build_parser, main

    seen, todo = 0, [build_parser()]
    while todo:
        parser = todo.pop()
        seen += 1
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    assert seen > 15  # every subcommand and nested job was visited
    with pytest.raises(SystemExit) as stop:
        main(["train", "--st", "5"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --st 5" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["demo", "--length", "0"], "error: --length: must be >= 2 (the sequence is also fed as two windows), got '0'"),
    (["demo", "--length", "x"], "error: --length: must be an integer, got 'x'"),
    (["train", "--lr", "-1e-3"], "error: --lr: expected one argument (a negative value is written --lr=-X)"),
])
def test_option_errors_say_what_to_change(capsys, argv, expected):
    from transformer_vq.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == expected


@pytest.mark.parametrize("kwargs, text, message", [
    (dict(low=0, low_open=True), "0", "must be > 0, got '0'"),
    (dict(low=0), "-1", "must be >= 0, got '-1'"),
    (dict(low=0, high=1, low_open=True), "1.5", "must be in (0, 1], got '1.5'"),
    (dict(low=0, high=1, high_open=True), "1", "must be in [0, 1), got '1'"),
    (dict(high=1, high_open=True), "1", "must be < 1, got '1'"),
    (dict(high=2), "2.5", "must be <= 2, got '2.5'"),
    (dict(low=0, why="0 = off"), "-0.5", "must be >= 0 (0 = off), got '-0.5'"),
    (dict(low=1e-3), "1e-4", "must be >= 0.001, got '1e-4'"),
    (dict(low=0), "x", "must be a number, got 'x'"),
    (dict(low=0), "", "must be a number, got ''"),
    (dict(low=0), "nan", "must be a finite number, got 'nan'"),
    (dict(high=1), "-inf", "must be a finite number, got '-inf'"),
    (dict(low=0), "inf", "must be a finite number, got 'inf'"),
    (dict(), "nan", "must be a finite number, got 'nan'"),
    (dict(low=0), "1e999", "is too large (overflows a float), got '1e999'"),
])
def test_float_in_refuses_as_the_config_fields_do(kwargs, text, message):
    import argparse

    from transformer_vq.config.flags import float_in

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        float_in(**kwargs)(text)
    assert str(refused.value) == message


@pytest.mark.parametrize("kwargs, text, value", [
    (dict(low=0), "0", 0.0),
    (dict(low=0, high=1), "1", 1.0),
    (dict(low=0, low_open=True), "1e-3", 1e-3),
    (dict(low=-1, high=1, low_open=True, high_open=True), " -0.5 ", -0.5),
    (dict(), "-7", -7.0),
])
def test_float_in_accepts_its_bounds_and_what_is_between(kwargs, text, value):
    from transformer_vq.config.flags import float_in

    got = float_in(**kwargs)(text)
    assert got == value and isinstance(got, float)


@pytest.mark.parametrize("text", ["x", "nan", "0", "-1e-3", "1e999"])
def test_float_in_words_a_refusal_as_a_float_field_on_the_command_line(capsys, text):
    """The same value refused by ``tvq train --lr`` (a field with min 0, exclusive) and by a flag of type
    ``float_in(0, low_open=True)``: the same words."""
    from transformer_vq.config.flags import Parser, float_in

    parser = Parser(prog="bench")
    parser.add_argument("--lr", type=float_in(0, low_open=True))
    for run in (lambda: main(["train", f"--lr={text}"]), lambda: parser.parse_args([f"--lr={text}"])):
        with pytest.raises(SystemExit) as stop:
            run()
        assert stop.value.code == 2
    train, bench = capsys.readouterr().err.strip().splitlines()
    assert bench == train and bench.startswith("error: --lr: ")


def test_float_in_keeps_its_bounds_and_checks_them():
    from transformer_vq.config.flags import float_in

    assert float_in(0, 1, low_open=True).bounds == {"min": 0, "max": 1, "min_open": True, "max_open": False}
    with pytest.raises(ValueError, match="low 2 is above high 1"):
        float_in(2, 1)


def commands_taking(flag: str, parser=None, words: tuple[str, ...] = ()):
    """The words of every command (``("classify", "train")``) whose parser has ``flag``."""
    import argparse

    for action in (parser or build_parser())._actions:
        if flag in action.option_strings:
            yield words
        for name, sub in action.choices.items() if isinstance(action, argparse._SubParsersAction) else ():
            yield from commands_taking(flag, sub, (*words, name))


def test_a_data_option_key_given_twice_is_refused_by_every_command_that_takes_one(capsys):
    """One of the two would be dropped without a word (the last one was kept), where a repeated value of the other
    list flags (--cells, --lengths) is refused."""
    found = list(commands_taking("--data-option"))
    assert {("train",), ("eval",), ("classify", "train"), ("ablate",)} <= set(found)
    for words in found:
        assert exit_code([*words, "--data-option", "lines=true", "--data-option", "lines=false"]) == 2, words
        assert capsys.readouterr().err == ("error: --data-option: lines is given twice ('lines=true', then "
                                           "'lines=false'); give each key once\n"), words
    with pytest.raises(ConfigError, match=r"seed is given twice \('seed=1', then ' seed = 1'\)"):
        parse_data_options(["seed=1", "n_train=2", " seed = 1"])  # the same key, even with the same value


def test_tvq_dash_dash_version_prints_the_library_s_version(capsys):
    """`tvq --version`, what users type first, was refused as an unrecognized argument (helper-72 audit-cli F8)."""
    import transformer_vq

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"transformer-vq {transformer_vq.__version__}\n"
