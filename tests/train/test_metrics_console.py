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
