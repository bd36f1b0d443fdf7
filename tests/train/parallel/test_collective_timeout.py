"""``--collective-timeout``: how long a torchrun worker waits in a collective for the others (helper-73 audit-dist2 F2:
a stalled worker held them for the backend's 30 minutes, with no option). Checked: the flag, its refusals, that the
training passes it to the process groups, and the one line of a timeout; a stalled worker under torchrun is
``test_torchrun_messages.py``'s."""

from __future__ import annotations

import pytest
import torch

from transformer_vq.cli import main
from transformer_vq.cli.errors import describe
from transformer_vq.config import ConfigError
from transformer_vq.config.load import load_config
from transformer_vq.train.lm import trainer as lm_trainer
from transformer_vq.train.parallel.distributed import setup_distributed, teardown_distributed


@pytest.mark.parametrize("args", [["--collective-timeout", "0"], ["--collective-timeout", "-5"],
                                  ["--collective-timeout", "1e12"], ["--collective-timeout", "soon"],
                                  ["--set", "collective_timeout=0"]])
def test_a_timeout_that_is_not_positive_seconds_is_refused_by_name(capsys, args):
    try:
        code = main(["train", *args, "--steps", "1"])
    except SystemExit as stopped:  # a flag's refusal, while parsing
        code = stopped.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --collective-timeout: must be") and \
        err.count("\n") == 1, err


def test_the_training_passes_its_timeout_to_the_process_groups(tmp_path, monkeypatch):
    seen = []

    def stop_here(device_type, parallel, context_parallel, timeout):
        seen.append(timeout)
        raise ConfigError("stop here")

    monkeypatch.setattr(lm_trainer, "setup_distributed", stop_here)
    cfg = load_config("tiny", overrides=["collective_timeout=42.5", f"run_dir={tmp_path / 'run'}", "seq_len=64",
                                         "update_len=32", "data=text", f"data_path={__file__}"])
    with pytest.raises(ConfigError, match="stop here"):
        lm_trainer.train(cfg)
    assert seen == [42.5]
    assert load_config("tiny").train.collective_timeout is None  # the backend's own (gloo 30 min, NCCL 10 min)


def test_the_group_waits_the_timeout_given():
    info = setup_distributed("cpu", "fsdp", timeout=7.5)  # a group of one: FSDP without torchrun
    try:
        backend = torch.distributed.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout.total_seconds() == 7.5
    finally:
        teardown_distributed(info)


@pytest.mark.parametrize("error, after", [
    (RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for "
                  "recv operation to complete"), " after 3 s"),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 1800000ms for "
                  "send operation to complete"), " after 1800 s"),
    (torch.distributed.DistBackendError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
                                        "OpType=ALLREDUCE, NumelIn=5, NumelOut=5, Timeout(ms)=600000) ran for 600021 "
                                        "milliseconds before timing out."), " after 600 s"),
])
def test_a_collective_timeout_is_one_line_not_a_lost_peer(error, after):
    assert describe(error) == (
        f"a collective between the workers of this torchrun run timed out{after}: another worker stalled (stopped, "
        f"hung, or far slower); the last checkpoint resumes with --resume auto, and --collective-timeout SECONDS "
        f"sets the wait")
    # a peer that is gone is still said as such
    assert describe(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:53989"))\
        .startswith("another worker of this torchrun run stopped")
