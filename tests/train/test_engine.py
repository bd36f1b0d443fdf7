"""The training engine (`transformer_vq.train.trainer.Trainer`) with a toy task: the order of validation and save, a
kill between them, a stop requested through the hook, a resume at the last step. The tasks' own tests (lm/,
classify/) show the same engine continuing bit for bit on real models."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from transformer_vq.config import ClassifyTrainConfig, ConfigError
from transformer_vq.train.checkpoint import latest_checkpoint
from transformer_vq.train.parallel.distributed import Distributed
from transformer_vq.train.trainer import Step, Trainer


class ToyModel(torch.nn.Module):
    """A linear regression with the codebook interface of the library's models, and no codebook."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x, y):
        loss = torch.nn.functional.mse_loss(self.linear(x), y)
        return SimpleNamespace(loss=loss, ce_loss=loss, commit_loss=torch.zeros(()))

    def codebook_stats(self, rank=0, world_size=1):
        return []

    def update_codebooks(self):
        pass

    def reset_codebook_stats(self):
        pass

    def codebook_metrics(self):
        return {}


@dataclass(frozen=True)
class ToyConfig:
    train: ClassifyTrainConfig
    model: None = None

    def to_dict(self):
        return {"model": {}, "train": self.train.to_dict()}

    def to_json(self):
        return json.dumps(self.to_dict())


class Kill(BaseException):
    """Stands for SIGKILL: nothing after it runs, no handler sees it."""


class ToyTrainer(Trainer):
    def __init__(self, cfg, events: list, kill_saving: int | None = None, stop_after: int | None = None):
        super().__init__(cfg, Distributed(), torch.device("cpu"), ToyModel)
        self.events, self.kill_saving, self.stop_after = events, kill_saving, stop_after

    def forward_backward(self) -> Step:
        g = torch.Generator().manual_seed(self.step)
        x = torch.randn(4, 3, generator=g)  # (B, 3)
        out = self.forward(x, x.sum(dim=1, keepdim=True))
        out.loss.backward()
        return Step(output=out, tokens=4)

    def validate(self):
        self.events.append(("validate", self.step))
        result = {"loss": float(self.step), "accuracy": 0.0}
        self.log_eval(result)
        return result

    def stop_requested(self) -> bool:
        return super().stop_requested() or self.step + 1 == self.stop_after

    def save(self) -> None:
        if self.step == self.kill_saving:
            raise Kill
        self.events.append(("save", self.step))
        super().save()


@pytest.fixture
def config(tmp_path):
    def make(**train):
        fields = {"run_dir": str(tmp_path / "run"), "steps": 6, "eval_every": 2, "ckpt_every": 2, "warmup_steps": 0,
                  "log_every": 100, "device": "cpu", **train}
        return ToyConfig(train=ClassifyTrainConfig(**fields))
    return make


def run(cfg, resume=None, **options) -> tuple[int, list]:
    events = []
    trainer = ToyTrainer(cfg, events, **options)
    trainer.run_dir.mkdir(parents=True, exist_ok=True)
    return trainer.run(resume), events


def test_validation_comes_before_the_save_of_its_step(config):
    exit_code, events = run(config())
    assert exit_code == 0
    assert events == [(kind, step) for step in (2, 4, 6) for kind in ("validate", "save")]


def test_a_kill_between_validation_and_save_loses_no_validation(config):
    """The checkpoint of step 4 never came to be: the resumed run replays from step 2 and validates step 4 again."""
    with pytest.raises(Kill):
        run(config(), kill_saving=4)
    assert latest_checkpoint(config().train.resolved_run_dir() / "checkpoints").step == 2
    exit_code, events = run(config(), resume="auto")
    assert exit_code == 0 and events[:2] == [("validate", 4), ("save", 4)]


def test_a_stop_request_saves_after_validating_and_exits_with_sigterms_code(config):
    exit_code, events = run(config(eval_every=3, ckpt_every=100), stop_after=3)
    assert exit_code == 128 + signal.SIGTERM
    assert events == [("validate", 3), ("save", 3)]


def test_a_run_resumed_at_its_last_step_validates_once_and_trains_nothing(config):
    run(config())
    exit_code, events = run(config(), resume="auto")
    assert exit_code == 0 and events == [("validate", 6)]


def logged(cfg) -> list[tuple]:
    """The lines of the run's metrics.jsonl as (kind, step)."""
    lines = (cfg.train.resolved_run_dir() / "metrics.jsonl").read_text().splitlines()
    return [("eval" if "eval" in row else "step", row["step"]) for row in map(json.loads, lines)]


def test_metrics_hold_each_step_once_after_a_kill(config):
    """Killed at the save of step 4, the run had logged steps 3 and 4 and the validation of 4; resumed from step 2
    it logs them again, in their place, and the torn line a kill mid-write leaves goes too."""
    with pytest.raises(Kill):
        run(config(), kill_saving=4)
    with open(config().train.resolved_run_dir() / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a line cut short by the kill
    run(config(), resume="auto")
    expected = [("step", s) for s in range(1, 7)]
    for s in (2, 4, 6):
        expected.insert(expected.index(("step", s)) + 1, ("eval", s))
    assert logged(config()) == expected


def test_a_run_resumed_at_its_last_step_logs_nothing_again(config):
    run(config())
    before = logged(config())
    exit_code, _ = run(config(), resume="auto")
    assert exit_code == 0 and logged(config()) == before


def test_a_resume_to_fewer_steps_than_done_is_refused(config):
    run(config())
    with pytest.raises(ConfigError, match="already at step 6 and --steps is 4; give --steps 6 to finish it"):
        run(config(steps=4), resume="auto")


def test_a_resume_that_trains_longer_says_the_schedule_moves(config, capsys):
    """More --steps recompute the cosine over the new total: the decayed learning rate rises, with no new warmup,
    and the resume says so with both rates (the plan's, then the new one's)."""
    from transformer_vq.train.optim import lr_factor

    run(config())
    capsys.readouterr()
    run(config(steps=12), resume="auto")
    tc = config(steps=12).train

    def lr(total):
        return tc.peak_lr * lr_factor(6, warmup_steps=tc.warmup_steps, total_steps=total, final_ratio=tc.final_lr_ratio)

    assert (f"note: steps 6 -> 12: the warmup-cosine schedule is recomputed over 12 steps, so the learning rate at "
            f"step 7 is {lr(12):.3g} where the run's plan ended at {lr(6):.3g} (no new warmup)"
            ) in capsys.readouterr().out
    assert lr(12) > lr(6)


def test_the_schedule_note_says_no_change_that_is_not_there():
    """Inside the warmup the total changes no rate yet (the note said 'is 0.00044 where the plan had 0.00044',
    helper-77 audit-classify F1); mid-run the old plan 'had' a rate, past its end it 'ended at' one."""
    from transformer_vq.config import TrainConfig
    from transformer_vq.train.optim import stretched_schedule_note

    cfg = TrainConfig(steps=12, warmup_steps=50)
    assert stretched_schedule_note(10, cfg, 10) == ("note: steps 10 -> 12: the warmup-cosine schedule is recomputed "
                                                    "over 12 steps: the learning rate is the same through the warmup "
                                                    "(to step 50), then decays over the new total")
    assert stretched_schedule_note(100, TrainConfig(steps=200, warmup_steps=10), 50).endswith(
        "where the run's plan had 0.00124 (no new warmup)")
    assert stretched_schedule_note(10, TrainConfig(steps=12, warmup_steps=2, final_lr_ratio=1.0), 10) is None


@pytest.mark.parametrize("model, warning", [
    ("tvq", None),
    ("tvq dropout", "warning: the checkpoint was saved by 1 worker, this run has 2: the random draws of dropsin, "
                    "droplyr continue from new seeds"),
    ("longvq", "warning: the checkpoint was saved by 1 worker, this run has 2: the random draws of dropout continue "
               "from new seeds"),
])
def test_another_worker_count_warns_only_of_what_draws_at_random(model, warning):
    """A resume on another number of workers reseeds the workers' random streams: said only where the model draws
    from them in training (the tiny preset draws nothing: a warning about dropout there misled), in the singular for
    one worker."""
    from transformer_vq.config.longvq import longvq_preset
    from transformer_vq.config.model import preset
    from transformer_vq.train.rng import rng_state

    cfg = {"tvq": preset("tiny"), "tvq dropout": preset("tiny", dropsin=0.1, droplyr=0.2),
           "longvq": longvq_preset("tiny", dropout=0.1)}[model]
    said = []
    trainer = SimpleNamespace(dist=Distributed(rank=1, world_size=2), cfg=SimpleNamespace(model=cfg),
                              tc=SimpleNamespace(seed=0), step=3, log=said.append)
    Trainer._restore_rng(trainer, [rng_state()])
    assert said == ([warning] if warning else [])
