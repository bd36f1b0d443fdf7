"""The registry of architectures: every model the commands build, by task and name (``--arch``), with its model
config class, its model class, its presets, and the commands and options that apply to it. Build, the command line,
``tvq export`` and ``tvq codebook`` read it; nothing else lists architectures.

Two tasks: ``lm`` (``tvq train``, whose run config names the architecture in ``arch``) and ``classify`` (``tvq
classify train``, whose training config names it in ``train.arch``). Torch-free, so that ``tvq --help`` stays fast:
a model class is named by its import path and imported where a model is built (:mod:`transformer_vq.train.models`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from transformer_vq.config.applies import given_problems, switch_problems
from transformer_vq.config.fields import ConfigError, check, fields_of
from transformer_vq.config.longvq import CLASSIFY_PRESETS, LONGVQ_LM_PRESETS, LongVQConfig
from transformer_vq.config.model import PRESETS, TransformerVQConfig

TASKS = {"lm": "tvq train", "classify": "tvq classify train"}
"""What an architecture is trained for (language modeling, classification), with the command that trains it."""
TRAINS = {"lm": "language models", "classify": "classifiers"}
"""What the training command of each task trains, in words."""
DEFAULT_ARCH = "tvq"
"""The architecture of a language-model run config that names none (every run written before LongVQ existed)."""
DEFAULT_PRESET = "small"
"""The model preset of a run that names none, for every architecture."""


@dataclass(frozen=True)
class Arch:
    """One architecture of one task."""

    task: str
    """``lm`` or ``classify`` (:data:`TASKS`)."""
    name: str
    """As ``--arch`` spells it (unique within its task)."""
    title: str
    """What it is, for messages ("a ...")."""
    config: type
    """Its model config class (the ``model`` section of its run configs)."""
    model: str
    """Its model class, as ``module:Class`` (built with the model config as its one argument)."""
    presets: Mapping[str, object]
    """Its model presets (``--preset``), instances of :attr:`config`."""
    commands: frozenset[str] = frozenset()
    """The commands, beside its training command, that read its runs (``eval``, ``sample``, ``export``,
    ``codebook``, ``classify eval``): any other refuses its runs, naming these (:func:`check_serves`)."""
    refused_options: Mapping[str, str] = field(default_factory=dict)
    """Options of its commands (model or training fields) that it does not read, each with the reason: given, they
    are refused (:func:`refuse_given`); a training switch set on is refused however the config was built. Where an
    option applies within an architecture (to encoders, to VQ attention) its field says so
    (:mod:`transformer_vq.config.applies`)."""


NO_SSM = "it has no SSM (positions come from sinusoids)"
ENCODER = "it is an encoder: every token attends the whole sequence"

ARCHS: tuple[Arch, ...] = (
    Arch("lm", "tvq", "a Transformer-VQ language model", TransformerVQConfig,
         "transformer_vq.models.tvq.model:TransformerVQ", PRESETS, frozenset({"eval", "sample", "export", "codebook"})),
    Arch("lm", "longvq", "a LongVQ causal language model (SSM and gated VQ attention)", LongVQConfig,
         "transformer_vq.models.longvq.model:LongVQLM", LONGVQ_LM_PRESETS, frozenset({"eval", "sample", "codebook"}),
         refused_options={"torch_compile": "compiles Transformer-VQ's gated attention units, which a LongVQ model "
                                           "has none of (leave it off)",
                         "context_parallel": "hands a rank the VQ-attention state of the ranks before it, and a "
                                             "LongVQ model's SSM state is not handed over (leave it at 1)",
                          "pack": "packs documents for Transformer-VQ's operators; a LongVQ model's SSM would carry "
                                  "one document into the next (leave it off)"}),
    Arch("classify", "longvq", "a LongVQ classifier", LongVQConfig,
         "transformer_vq.models.longvq.model:LongVQClassifier", CLASSIFY_PRESETS,
         frozenset({"classify eval", "codebook"})),
    Arch("classify", "transformer", "a full-attention Transformer classifier (baseline)", LongVQConfig,
         "transformer_vq.models.baselines.classifiers:TransformerClassifier", CLASSIFY_PRESETS,
         frozenset({"classify eval"}),
         refused_options={**dict.fromkeys(("n_code", "ema_rate", "commit_coef", "dead_code_restart"),
                                          "it has no codebook (softmax attention over unquantized keys)"),
                          "d_v": "its heads split d_model (it has no separate value width)",
                          "ema_dim": NO_SSM, "ema_timescale": NO_SSM, "scoring": "its attention is softmax",
                          "norm": "its norms are layer norms",
                          "causal": ENCODER, "block_len": "it attends the whole sequence at once, in no blocks"}),
    Arch("classify", "tvq", "a Transformer-VQ encoder classifier (baseline)", LongVQConfig,
         "transformer_vq.models.baselines.classifiers:TransformerVQEncoderClassifier", CLASSIFY_PRESETS,
         frozenset({"classify eval", "codebook"}),
         refused_options={"d_ffn": "its gated attention units have no separate FFN", "ema_dim": NO_SSM,
                          "ema_timescale": NO_SSM,
                          "scoring": "its VQ attention is softmax", "norm": "its units normalize with RMS norms",
                          "causal": ENCODER}),
)


def names(task: str) -> tuple[str, ...]:
    """The architectures of ``task``, as ``--arch`` spells them."""
    return tuple(a.name for a in ARCHS if a.task == task)


LM_ARCHS = names("lm")
"""'tvq': Transformer-VQ; 'longvq': LongVQ's causal language model."""
CLASSIFY_ARCHS = names("classify")
"""The classifiers: LongVQ, the full-attention Transformer baseline, the Transformer-VQ encoder (docs/longvq.md)."""
LM_PRESETS = {a.name: a.presets for a in ARCHS if a.task == "lm"}


def find_arch(task: str, name) -> Arch:
    """The architecture ``name`` of ``task``; a :class:`ConfigError` naming the choices otherwise."""
    for a in ARCHS:
        if a.task == task and a.name == name:
            return a
    raise ConfigError(f"unknown architecture {name!r}; available: {', '.join(names(task))}")


def run_arch(config: dict) -> Arch:
    """The architecture of a saved run config (a checkpoint's ``config.json``), which records its ``task``: a
    classification run's names it in ``train.arch``, a language-model run's in ``arch`` (none: Transformer-VQ). A run
    saved before runs recorded their task is a classification run when ``train`` names an ``arch``."""
    if not isinstance(config, dict):
        raise ConfigError(f"a run config is a mapping with 'task', 'model' and 'train', got {type(config).__name__}")
    train = config.get("train")
    task = config.get("task", "classify" if isinstance(train, dict) and "arch" in train else "lm")
    if task not in TASKS:
        raise ConfigError(f"the run config's task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "classify":
        return find_arch("classify", train.get("arch") if isinstance(train, dict) else None)
    return find_arch("lm", config.get("arch", DEFAULT_ARCH))


def check_serves(config: dict, command: str, path) -> Arch:
    """The architecture of run config ``config`` (of the run or checkpoint at ``path``), when ``tvq command`` reads
    its runs; a :class:`ConfigError` naming the run's kind and the commands that serve it otherwise."""
    arch = run_arch(config)
    if command not in arch.commands:
        raise ConfigError(f"--ckpt: {holds(arch, path)}, and tvq {command} reads {serving(command)}; for this run "
                          f"use {commands_reading(arch)}")
    return arch


def commands_reading(arch: Arch, but: str | None = None) -> str:
    """The commands that read runs of ``arch`` (all but ``but``), as refusals name them: ``tvq eval, tvq sample``."""
    return ", ".join(f"tvq {c}" for c in sorted(arch.commands - {but}))


def check_trains(arch: Arch, task: str, path) -> None:
    """Refuse (:class:`ConfigError`) to continue the run at ``path``, of architecture ``arch`` (:func:`run_arch` of
    its config), with the training command of ``task`` when it is a run of the other task: the message names the
    run's kind and the command that continues it (rather than the fields the other task's config lacks)."""
    if arch.task != task:
        raise ConfigError(f"--resume: {holds(arch, path)}, and {TASKS[task]} continues {TRAINS[task]} only; "
                          f"continue this run with {TASKS[arch.task]} --resume, or start a new one with another "
                          f"--run-dir")


def holds(arch: Arch, path) -> str:
    """The words refusals name a run with: ``runs/x holds a LongVQ classifier (a run of tvq classify train --arch
    longvq)``."""
    return f"{path} holds {arch.title} (a run of {TASKS[arch.task]} --arch {arch.name})"


def arch_of(model) -> str:
    """The language-model architecture whose config class ``model`` (a model config) is."""
    for a in ARCHS:
        if a.task == "lm" and type(model) is a.config:
            return a.name
    classes = [a.config.__name__ for a in ARCHS if a.task == "lm"]
    raise ConfigError(f"a language-model run takes a {' or a '.join(classes)}, got {type(model).__name__}")


def lm_preset(name: str, preset: str | None):
    """The model preset ``preset`` (default ``small``) of language-model architecture ``name``."""
    presets = find_arch("lm", name).presets
    preset = DEFAULT_PRESET if preset is None else preset
    if preset not in presets:
        of = "" if name == DEFAULT_ARCH else f" of arch {name!r}"
        raise ConfigError(f"unknown model preset {preset!r}{of}; available: {', '.join(presets)}")
    return presets[preset]


def foreign_fields(name: str, fields, *, arch_flag: bool = True) -> str | None:
    """Why model fields ``fields`` cannot configure a ``name`` language model, when some belong to another
    architecture only (None when every one is its own, or none is known at all: the builder names those).
    ``arch_flag``: whether the command can train the other architecture (``tvq train --arch``; ``tvq ablate``
    cannot), which decides the advice."""
    own = {f.name for f in dataclasses.fields(find_arch("lm", name).config)}
    for other in ARCHS:
        theirs = sorted((set(fields) - own) & {f.name for f in dataclasses.fields(other.config)})
        if other.task == "lm" and other.name != name and theirs:
            found = f"model field(s) {', '.join(theirs)} belong to arch {other.name!r}"
            if not arch_flag:
                return f"{found}; this command trains arch {name!r} only: leave them out"
            return (f"{found}, and this run's arch is {name!r}; give --arch {other.name} (arch: {other.name} in a "
                    f"config file) or leave them out")
    return None



def serving(command: str) -> str:
    """The architectures whose checkpoints ``command`` reads, for its refusals: "a Transformer-VQ language model
    (tvq train --arch tvq)"."""
    return " or ".join(f"{a.title} ({TASKS[a.task]} --arch {a.name})" for a in ARCHS if command in a.commands)


def refuse_given(arch: Arch, given: Mapping[type, Iterable[str]], context: Mapping[str, object]) -> None:
    """Refuse (:class:`ConfigError`) the options given where they do not apply: for each config class of ``given``
    the names of its fields the user gave; ``context`` the run's fields, flat (:mod:`transformer_vq.config.applies`).
    The problems of one config class are reported together, the first class with any first."""
    for cls, names in given.items():
        found = not_applying(arch, cls, names, context)
        if found:
            detail = "; ".join(f"{name} {text}" for name, text in found)
            raise ConfigError(f"invalid {cls.__name__}: {detail}", found, cls)


def not_applying(arch: Arch, cls: type, names: Iterable[str], context: Mapping[str, object]) -> list[tuple[str, str]]:
    """``(field, why)`` for each field of ``cls`` named in ``names`` that does not apply to ``arch`` or under
    ``context``: what :func:`refuse_given` refuses of the user's fields, and what a classifier recipe leaves out of
    its own (:func:`~transformer_vq.config.classify.classify_config`)."""
    names = set(names) & set(fields_of(cls))
    found = [(name, _not_read(arch, name)) for name in sorted(names & set(arch.refused_options))]
    return found + given_problems(cls, names - set(arch.refused_options), context)


def _not_read(arch: Arch, name: str) -> str:
    others = [a.name for a in ARCHS if a.task == arch.task and name not in a.refused_options]
    where = f"it applies to arch {' and '.join(others)}" if others else "no architecture reads it"
    return f"does not apply to {arch.title} (arch {arch.name}): {arch.refused_options[name]}; {where}; leave it out"


def run_context(cfg) -> dict:
    """The fields of a run config (a language model's or a classifier's), flat, with its ``arch``: where the
    conditions of :mod:`transformer_vq.config.applies` are looked up."""
    return {**cfg.model.to_dict(), **cfg.train.to_dict(), "arch": cfg.arch}


def refuse_job_options(job, run_cfg) -> None:
    """Refuse (:class:`ConfigError`) an option of a job (``tvq eval``, ``tvq sample``: ``job`` its config) set away
    from its default where the run it reads (``run_cfg``) makes it mean nothing: an image model's sample has no
    prompt, a greedy one no ``top_k``."""
    check(job, switch_problems(job, {**run_context(run_cfg), **dataclasses.asdict(job)}, switches_only=False))
