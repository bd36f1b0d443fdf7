"""The training console: a bar where stdout is a terminal, plain lines elsewhere, and never on another stream."""

import io

from transformer_vq.train.metrics import MetricsLogger


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


STEP = {"step": 1, "loss": 2.5, "bits_per_byte": 3.6, "lr": 1e-3, "tokens": 64, "seconds": 0.1}


def _log_one_step(tmp_path, monkeypatch, stdout, stderr):
    monkeypatch.setattr("sys.stdout", stdout)
    monkeypatch.setattr("sys.stderr", stderr)
    logger = MetricsLogger(tmp_path, total_steps=1, start_step=0, log_every=1)
    logger.log_step(dict(STEP))
    logger.log_eval(1, "validation", {"loss": 2.4, "bits_per_byte": 3.5})
    logger.close()


def test_the_bar_is_drawn_on_the_terminal_stdout_is_even_when_stderr_is_a_file(tmp_path, monkeypatch):
    stdout, stderr = Terminal(), io.StringIO()
    _log_one_step(tmp_path, monkeypatch, stdout, stderr)
    assert "1/1" in stdout.getvalue() and "validation loss 2.4000" in stdout.getvalue()
    assert stderr.getvalue() == ""


def test_off_a_terminal_the_console_gets_plain_lines(tmp_path, monkeypatch):
    stdout, stderr = io.StringIO(), Terminal()
    _log_one_step(tmp_path, monkeypatch, stdout, stderr)
    assert stdout.getvalue().splitlines()[0].startswith("step 1/1  loss 2.5000  bpb 3.600")
    assert "\r" not in stdout.getvalue() and stderr.getvalue() == ""


def test_steps_that_compiled_a_graph_are_left_out_of_the_rate(tmp_path, monkeypatch):
    """--torch-compile: the first steps spend about a minute compiling each; counted in, a short run reported
    6 training tokens/s (helper-73 audit-dist2 F3). They are timed apart and said apart."""
    stdout = io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    logger = MetricsLogger(tmp_path, total_steps=4, start_step=0, log_every=2)
    for step, seconds, compiled in ((1, 60.0, True), (2, 0.5, False), (3, 30.0, True), (4, 0.25, True)):
        logger.log_step({**STEP, "step": step, "seconds": seconds, "compiled": compiled})
    logger.close()
    assert logger.tokens_per_s == 64 / 0.5  # step 2 alone
    assert (logger.compile_steps, logger.compile_seconds) == (3, 90.25)
    first, second = stdout.getvalue().splitlines()
    assert "tok/s 128  (compiled graphs: 1 step left out of tok/s)" in first
    assert "tok/s -  (compiled graphs: 2 steps left out of tok/s)" in second


def test_the_end_of_run_line_says_the_compiling_steps_apart():
    from types import SimpleNamespace

    from transformer_vq.cli.train import rate_text

    assert rate_text(SimpleNamespace(tokens_per_s=1471.2, compile_steps=0)) == " at 1,471 training tokens/s"
    assert rate_text(SimpleNamespace(tokens_per_s=1471.2, compile_steps=3, compile_seconds=95.04)) == \
        " at 1,471 training tokens/s (3 steps that compiled graphs took 95.0 s, left out)"
    assert rate_text(SimpleNamespace(tokens_per_s=None, compile_steps=1, compile_seconds=60.0)) == \
        " (no rate: 1 step that compiled graphs took 60.0 s)"
    assert rate_text(SimpleNamespace(tokens_per_s=None, compile_steps=0)) == ""


def test_graphs_compiled_counts_torch_compile_graphs():
    import torch

    from transformer_vq.train.metrics import graphs_compiled

    before = graphs_compiled()
    square = torch.compile(lambda x: x * x, backend="eager")
    square(torch.ones(2))
    after = graphs_compiled()
    square(torch.ones(2))
    assert after == before + 1 and graphs_compiled() == after  # a graph compiled once, then reused
