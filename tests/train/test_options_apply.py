"""Every option is used or refused (issue 21, item 1): for each command and architecture, in each mode that changes
which options apply, every option either changes what runs or is refused where it does not apply.

The evidence depends on the kind of option:

* model fields: the model built with another value differs from the one built with the preset's: its state, a forward
  pass with a loss on a fixed batch in training mode (dropouts drawn from a fixed seed), and its codebooks after two
  updates. An option whose new value builds the same model is silently ignored, and fails the test.
* training and job fields: the command's code reads the field while a tiny run of the command goes through every
  phase (steps, validation, checkpoint, end sample; the job on the run). A recording config notes each read, except
  the reads of the configs' own validation and serialization. A field no code reads is ignored, and fails the test.

Refused means the config builders of the command (``load_config``, ``classify_config``, the jobs' checks on the run
they read) raise a ConfigError naming the option, given a valid value. Both checks are shown to catch an ignored
field (the ``*_catches_*`` tests).
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from transformer_vq.config import (ClassifyEvalConfig, ClassifyTrainConfig, ConfigError, EvalConfig, LongVQConfig,
                                   SampleConfig, TrainConfig, classify_config, load_config)
from transformer_vq.config.applies import given_problems
from transformer_vq.config.arch import find_arch, refuse_given, run_context
from transformer_vq.config.fields import fields_of, kinds, option
from transformer_vq.config.jobs import ExportConfig
from transformer_vq.train.lm.objective import masked_window
from transformer_vq.train.models import instantiate

from trainutil import write_corpus

SEEN_AS_IGNORED = {"attn_backend": "its other value, 'triton', runs on CUDA only (tests/ops/vq/test_vq_triton.py)"}
"""Options this CPU test cannot exercise, each with where it is tested instead."""

SAME_WITH_ONE_HEAD = {"head_type": "with one head (n_head 1) 'shga', 'mqa' and 'mha' are one computation; the mode "
                                   "with two heads shows it consumed"}
"""Options whose values coincide in a mode by definition, with the mode that shows them consumed."""

LM_MODES = {
    "tvq": [{}, {"attn_type": "full"}, {"attn_type": "flash"}, {"attn_type": "flash_quad"}, {"causal": False},
            {"head_type": "mha", "n_head": 2}, {"quantize_queries": True}, {"compressive_cache": False}],
    "longvq": [{}],
}
CLASSIFY_MODES = {"longvq": [{}, {"causal": True}], "transformer": [{}], "tvq": [{}]}
IDS = torch.arange(64).reshape(2, 32) % 13  # (B, T): T a multiple of every block length tried


def alternatives(cls, name, value) -> list:
    """Other valid-looking values of field ``name`` (the first that builds is used)."""
    field, kind = fields_of(cls)[name], kinds(cls)[name]
    if kind.base is bool:
        return [not value]
    if "choices" in field.metadata:
        return [c for c in field.metadata["choices"] if c != value]
    if kind.base is int:
        return [value * 2, value + 1]
    return [value / 2 if value else 0.25]


def lm_build(arch: str, mode: dict, changes: dict):
    return load_config("tiny", arch=arch, values={"model": {**mode, **changes}, "train": {}})


def classify_build(arch: str, mode: dict, changes: dict):
    return classify_config(n_classes=3, vocab_size=16, preset="tiny", model={**mode, **changes},
                           train={"arch": arch})


def fingerprint(arch, model_cfg) -> list[torch.Tensor]:
    """What a model of ``model_cfg`` computes: its output and loss on a fixed batch in training mode (an encoder's on
    the batch its objective masks), and its state after two codebook updates."""
    torch.manual_seed(0)
    model = instantiate(arch, model_cfg).train()
    found = []
    for _ in range(2):
        if arch.task == "lm" and not model_cfg.causal:  # an encoder's objective: masked tokens (train/lm/objective)
            inputs, targets, masked = masked_window(IDS, cfg=model_cfg, seed=0, step=0, first_row=0)
            out = model(inputs, targets=targets, loss_mask=masked)
        elif arch.task == "lm":
            out = model(IDS, targets=IDS)
        else:
            out = model(IDS, labels=torch.tensor([0, 2]))
        found += [out.logits.detach(), out.loss.detach()]
        model.update_codebooks()
    return found + list(model.state_dict().values())


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def refused(build, name: str) -> bool:
    """Whether building with option ``name`` given is refused with an error that names it."""
    try:
        build()
    except ConfigError as err:
        return name in {field for field, _ in err.problems} or name in str(err)
    return False


def model_verdicts(task: str, arch_name: str, mode: dict, build, model_cls) -> dict[str, str]:
    """Per model field: 'consumed', 'refused' or 'IGNORED' in ``mode``."""
    arch = find_arch(task, arch_name)
    base = build(arch_name, mode, {})
    reference = fingerprint(arch, base.model)
    verdicts = {}
    for name in fields_of(model_cls):
        if name in SEEN_AS_IGNORED or (name in SAME_WITH_ONE_HEAD and getattr(base.model, "n_head", 2) == 1):
            continue
        verdict = "IGNORED"
        for value in alternatives(model_cls, name, getattr(base.model, name)):
            if refused(lambda: build(arch_name, mode, {name: value}), name):
                verdict = "refused"
                continue
            changed = build(arch_name, mode, {name: value})
            verdict = "refused" if changed.model == base.model else \
                "consumed" if not same(fingerprint(arch, changed.model), reference) else "IGNORED"
            break
        verdicts[name] = verdict
    return verdicts


@pytest.mark.parametrize("arch, mode", [(a, m) for a, modes in LM_MODES.items() for m in modes],
                         ids=lambda x: (x if isinstance(x, str)
                                        else "-".join(f"{k}={v}" for k, v in x.items()) or "base"))
def test_every_model_option_of_tvq_train_is_consumed_or_refused(arch, mode):
    model_cls = find_arch("lm", arch).config
    verdicts = model_verdicts("lm", arch, mode, lm_build, model_cls)
    assert [name for name, v in verdicts.items() if v == "IGNORED"] == []


@pytest.mark.parametrize("arch, mode", [(a, m) for a, modes in CLASSIFY_MODES.items() for m in modes],
                         ids=lambda x: (x if isinstance(x, str)
                                        else "-".join(f"{k}={v}" for k, v in x.items()) or "base"))
def test_every_model_option_of_tvq_classify_train_is_consumed_or_refused(arch, mode):
    verdicts = model_verdicts("classify", arch, mode, classify_build, LongVQConfig)
    assert [name for name, v in verdicts.items() if v == "IGNORED"] == []


def test_the_model_check_catches_an_ignored_field():
    """A model config with a field its model never reads is found IGNORED."""

    @dataclasses.dataclass(frozen=True)
    class WithUnused(LongVQConfig):
        unused_knob: int = option(1, "Read by nothing.", min=1)

    def build(arch_name, mode, changes):
        cfg = classify_build(arch_name, mode, {k: v for k, v in changes.items() if k != "unused_knob"})
        return dataclasses.replace(cfg, model=WithUnused(**{**cfg.model.to_dict(), **changes}))

    verdicts = model_verdicts("classify", "longvq", {}, build, WithUnused)
    assert verdicts["unused_knob"] == "IGNORED" and verdicts["d_model"] == "consumed"


# ---- training and job fields: read, or refused ------------------------------------------------------------------

SILENT = frozenset({"asdict", "_asdict_inner", "replace", "__post_init__", "check", "to_dict", "to_json", "__eq__",
                    "__repr__", "__hash__", "run_context", "switch_problems", "refuse_job_options"})
"""Functions whose reads of a config are its own validation and serialization, not a use."""


def recording(cls, reads: set):
    """A subclass of config class ``cls`` that adds to ``reads`` the name of each field read by the code."""
    names = frozenset(fields_of(cls))

    def __getattribute__(self, name):
        if name in names:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_name not in SILENT:
                frame = frame.f_back
            if frame is None:
                reads.add(name)
        return object.__getattribute__(self, name)

    return type(f"Recording{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})


def unread(cls, reads: set, context: dict, arch=None) -> list[str]:
    """The fields of ``cls`` not read, and not refused where ``context`` says the run is."""
    left = []
    for name in sorted(set(fields_of(cls)) - reads):
        if arch is not None:
            try:
                refuse_given(arch, {cls: {name}}, context)
            except ConfigError:
                continue
        elif given_problems(cls, [name], context):
            continue
        left.append(name)
    return left


TINY_LM = dict(data="text", seq_len=32, update_len=16, batch_size=4, steps=2, eval_every=1, ckpt_every=1,
               eval_tokens=128, eval_streams=2, sample_tokens=3, log_every=1, device="cpu", threads=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "text.txt", n_lines=300)


def train_recorded(corpus, run_dir, arch: str, model: dict, train: dict):
    from transformer_vq.train import train as train_lm

    reads = set()
    base = load_config("tiny", arch=arch, values={"model": model, "train": {}})
    cfg = dataclasses.replace(base, train=recording(TrainConfig, reads)(
        **{**TINY_LM, "data_path": str(corpus), "run_dir": str(run_dir), **train}))
    assert train_lm(cfg).exit_code == 0
    return cfg, reads


@pytest.mark.parametrize("arch, model, train", [
    ("tvq", {}, {}),
    ("tvq", {"causal": False}, {"optimizer": "adafactor"}),
    ("longvq", {}, {}),
], ids=["tvq", "tvq-encoder-adafactor", "longvq"])
def test_every_option_of_tvq_train_and_its_jobs_is_read_or_refused(corpus, tmp_path, arch, model, train):
    from transformer_vq.ablate.codebook import codebook_report
    from transformer_vq.export import export
    from transformer_vq.train import evaluate, sample

    cfg, reads = train_recorded(corpus, tmp_path / "run", arch, model, train)
    context = run_context(cfg)
    assert unread(TrainConfig, reads, context, find_arch("lm", arch)) == []
    run = str(tmp_path / "run")
    eval_reads = set()
    evaluate(recording(EvalConfig, eval_reads)(ckpt=run, max_tokens=64, window_len=16, streams=2, device="cpu"))
    assert unread(EvalConfig, eval_reads, context) == []
    if cfg.model.causal:
        sample_reads = set()
        "".join(sample(recording(SampleConfig, sample_reads)(ckpt=run, max_new_tokens=3, top_k=5, device="cpu")))
        assert unread(SampleConfig, sample_reads, {**context, "temperature": 1.0}) == []
    else:
        with pytest.raises(ConfigError, match="holds an encoder"):
            sample(SampleConfig(ckpt=run))
    if arch == "tvq":
        export_reads = set()
        export(recording(ExportConfig, export_reads)(ckpt=run, format="safetensors", out=str(tmp_path / "out")))
        assert unread(ExportConfig, export_reads, context) == []
    assert codebook_report(run)["units"]


@pytest.mark.parametrize("arch", ["longvq", "transformer", "tvq"])
def test_every_option_of_tvq_classify_train_and_eval_is_read_or_refused(tmp_path, arch):
    pytest.importorskip("sklearn")
    from transformer_vq.train.classify import classify_eval, classify_train

    reads = set()
    base = classify_build(arch, {}, {})
    cfg = dataclasses.replace(base, train=recording(ClassifyTrainConfig, reads)(
        **{**base.train.to_dict(), "data": "digits", "steps": 2, "batch_size": 4, "eval_every": 1, "ckpt_every": 1,
           "log_every": 1, "device": "cpu", "threads": 1, "run_dir": str(tmp_path / "run")}))
    from transformer_vq.train.classify.build import load_classify_data

    data = load_classify_data(cfg.train)
    cfg = dataclasses.replace(cfg, model=cfg.model.replace(n_classes=data.n_classes, vocab_size=data.vocab_size))
    assert classify_train(cfg, data=data).exit_code == 0
    assert unread(ClassifyTrainConfig, reads, run_context(cfg), find_arch("classify", arch)) == []
    eval_reads = set()
    classify_eval(recording(ClassifyEvalConfig, eval_reads)(ckpt=str(tmp_path / "run"), split="validation",
                                                            batch_size=32, plot=str(tmp_path / "c.png"),
                                                            device="cpu"))
    assert unread(ClassifyEvalConfig, eval_reads, run_context(cfg)) == []


def test_the_read_check_catches_an_ignored_field(corpus, tmp_path):
    """A training config with a field no code reads is found: the check can fail."""

    @dataclasses.dataclass(frozen=True)
    class WithUnused(TrainConfig):
        unused_knob: int = option(1, "Read by nothing.", min=1)

    reads = set()
    base = load_config("tiny")
    cfg = dataclasses.replace(base, train=recording(WithUnused, reads)(
        **{**TINY_LM, "data_path": str(corpus), "run_dir": str(tmp_path / "run")}))
    from transformer_vq.train import train as train_lm

    assert train_lm(cfg).exit_code == 0
    assert unread(WithUnused, reads, run_context(cfg), find_arch("lm", "tvq")) == ["unused_knob"]
