"""Sequence-classification runs (``tvq classify``): how to train a classifier (:class:`ClassifyTrainConfig`), the run
config that pairs it with the model (:class:`ClassifyConfig`), and how to evaluate one (:class:`ClassifyEvalConfig`).
Frozen and validated like the language-model configs; every field is a flag of ``tvq classify train`` / ``eval``.
docs/longvq.md, "Classification"."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from transformer_vq.config.choices import CLASSIFY_DATASETS, DEVICES, OPTIMIZERS, PRECISIONS, SPLITS
from transformer_vq.config.fields import ConfigError, build, check, option, png_path_problem
from transformer_vq.config.arch import (ARCHS, CLASSIFY_ARCHS, DEFAULT_PRESET, find_arch, not_applying, refuse_given,
                                        run_arch, run_context)
from transformer_vq.config.longvq import CLASSIFY_PRESETS, LongVQConfig
from transformer_vq.config.recipes import find_recipe
from transformer_vq.config.jobs import threads_option
from transformer_vq.config.train import ADAMW, name_problem, retain_host_memory_option

FROM_DATA = ("vocab_size", "n_classes")
"""Model fields every classification run takes from its dataset."""


@dataclass(frozen=True)
class ClassifyTrainConfig:
    """How to train a sequence classifier: data, batches, optimizer (Sec. 5 of LongVQ: AdamW, gradient clip 0.1),
    schedule, evaluation, checkpoints."""

    arch: str = option("longvq", "Classifier (" + "; ".join(f"'{a.name}': {a.title}" for a in ARCHS if a.task ==
                                                             "classify") + "); all built from the same model fields.",
                       choices=CLASSIFY_ARCHS)
    data: str = option("digits", "Dataset of transformer_vq.data.classify (docs/datasets.md).",
                       choices=CLASSIFY_DATASETS, defines_data=True)
    data_path: str | None = option(None, "Where the dataset's released files are (cifar10, imdb, aan; optional "
                                         "for the others).")
    data_options: dict = option(factory=dict, help="Keyword options of the dataset loader (e.g. n_train=2000 "
                                "for listops); repeatable KEY=VALUE.", flag="data-option", defines_data=True)
    name: str = option("classify", "Run name; the run directory defaults to runs/<name>.",
                       applies={"run_dir": (None,)})
    run_dir: str | None = option(None, "Where checkpoints, metrics and TensorBoard events go (default "
                                       "runs/<name>).")
    seed: int = option(0, "Seeds the initialization, dropout and the order of training examples.", min=0,
                       defines_data=True)
    batch_size: int = option(32, "Training examples per step.", min=1)
    eval_batch_size: int = option(64, "Examples per forward call of an evaluation (memory only).", min=1)
    steps: int = option(1000, "Number of optimizer steps.", min=1)
    optimizer: str = option("adamw", "'adamw' (LongVQ's Sec. 5) or 'adafactor'.", choices=OPTIMIZERS)
    lr: float = option(2e-3, "Peak learning rate.", min=0.0, min_open=True)
    weight_decay: float = option(0.01, "Decoupled weight decay of parameters with more than one dimension.",
                                 min=0.0)
    warmup_steps: int = option(50, "Linear warmup steps, then cosine decay (a run of no more steps ends in its "
                                   "warmup, and its start says so).", min=0)
    final_lr_ratio: float = option(0.1, "The cosine schedule ends at this fraction of the peak learning rate.",
                                   min=0.0, max=1.0)
    grad_clip: float = option(0.1, "Global gradient-norm clip for adamw (LongVQ's Sec. 5: 0.1; 0 = off).",
                              min=0.0, applies=ADAMW)
    precision: str = option("float32", "'float32' or 'bfloat16' (autocast; parameters stay float32).",
                            choices=PRECISIONS)
    device: str = option("auto", "'auto' (cuda when available), 'cpu' or 'cuda'.", choices=DEVICES)
    threads: int = threads_option()
    retain_host_memory: bool = retain_host_memory_option()
    log_every: int = option(10, "Print a line every this many steps when not on a terminal.", min=1)
    eval_every: int = option(100, "Evaluate on the validation split every this many steps (0 = only at the end).",
                             min=0)
    ckpt_every: int = option(200, "Save a checkpoint every this many steps (and always at the end).", min=1)
    keep_ckpts: int = option(2, "How many most recent checkpoints to keep.", min=1)
    max_nonfinite: int = option(5, "Stop when this many steps in a row have a non-finite loss or gradient.",
                                min=1)

    def __post_init__(self):
        check(self, [("name", name_problem(self.name))] if name_problem(self.name) else [])

    @property
    def peak_lr(self) -> float:
        """The learning rate after warmup (the optimizer builders read this name)."""
        return self.lr

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def to_dict(self) -> dict:
        """The fields as plain values (tuples stay tuples; JSON writes them as lists)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ClassifyConfig:
    """A classification run: the model (``n_classes`` and ``vocab_size`` those of the dataset) and how to train it.
    Saved as JSON with every checkpoint."""

    model: LongVQConfig = option(help="The classifier's fields (every arch reads the same ones).")
    train: ClassifyTrainConfig = option(factory=ClassifyTrainConfig, help="How to train it.")
    recipe: dict = option(factory=dict, help="The fields a per-dataset recipe set (transformer_vq.config.recipes): "
                                             "'model' and 'train', each a mapping of field to value; empty when "
                                             "the run started from a preset.")

    def __post_init__(self):
        if self.model.n_classes < 1:
            raise ConfigError(f"a classification run needs n_classes >= 1 (from its dataset), got "
                              f"{self.model.n_classes}")

    @property
    def arch(self) -> str:
        """The classifier (``train.arch``)."""
        return self.train.arch

    def to_dict(self) -> dict:
        """The whole config as plain values, as the run's ``config.json`` holds it (``from_dict`` reads it back)."""
        return {"task": "classify", "model": self.model.to_dict(), "train": self.train.to_dict(),
                "recipe": self.recipe}

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON, keys sorted."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict) -> "ClassifyConfig":
        """Rebuild from :meth:`to_dict` output (a checkpoint's config.json)."""
        if not isinstance(values, dict) or not {"model", "train"} <= set(values) <= {"task", "model", "train",
                                                                                        "recipe"}:
            raise ConfigError("a classification run config is a mapping with 'model' and 'train' (and 'task', "
                              "'recipe')")
        if run_arch(values).task != "classify":
            raise ConfigError(f"this is the config of {run_arch(values).title}, not of a classifier; read it with "
                              f"RunConfig.from_dict")
        return cls(model=build(LongVQConfig, values["model"], "model"),
                   train=build(ClassifyTrainConfig, values["train"], "train"), recipe=values.get("recipe", {}))


def classify_config(*, n_classes: int, vocab_size: int, preset: str | None = None, model: dict | None = None,
                    train: dict | None = None, base: ClassifyConfig | None = None) -> ClassifyConfig:
    """A :class:`ClassifyConfig` for a dataset of ``n_classes`` classes and ``vocab_size`` token ids, with the fields
    of ``model`` and ``train`` on top of a starting point: the saved config ``base`` of a run being resumed (its model
    fields replaced by those of ``preset`` when one is named); else the model ``preset`` (an encoder: ``causal``
    false unless ``model`` says otherwise) with the training fields' defaults; else (no preset) the ``small`` preset
    with the recipe of the run's arch and dataset (:mod:`transformer_vq.config.recipes`) where there is one (an
    encoder's: not when ``model`` makes it causal). ``recipe`` records the recipe's fields still in effect (a
    resumed run's, less those ``model``, ``train`` or ``preset`` replace, and less those that do not apply under the
    user's choices: :func:`applying_recipe`). A field of ``model`` or ``train`` that the classifier does not read is
    refused (:func:`~transformer_vq.config.arch.refuse_given`)."""
    model, train = dict(model or {}), dict(train or {})
    given = sorted(set(model) & set(FROM_DATA))
    if given:
        raise ConfigError(f"model field(s) {', '.join(given)} come from the dataset; leave them out")
    if preset is not None and preset not in CLASSIFY_PRESETS:
        raise ConfigError(f"unknown classifier preset {preset!r}; available: {', '.join(CLASSIFY_PRESETS)}")
    if base is not None:
        # a preset replaces every model field, so none of the recipe's model fields is left in effect
        recipe = recipe_left(base.recipe, None if preset is not None else model, train)
    else:
        plain = build(ClassifyTrainConfig, train, "train")  # the arch and dataset the recipe is looked up by
        # recipes are tuned for encoders (batch norm would let a causal model see later tokens)
        found = find_recipe(plain.arch, plain.data) if preset is None and not model.get("causal") else None
        recipe = {} if found is None else recipe_left({"model": found.model, "train": found.train}, model, train)

    def make(kept: dict) -> ClassifyConfig:
        """The config with the recipe's fields ``kept``: a new run starts from them, a resumed one (whose saved
        fields hold them already) only records them."""
        if base is not None:
            start = base.model.to_dict() if preset is None else preset_start(preset, {})
            start_train = base.train.to_dict()
        else:
            start, start_train = preset_start(preset, kept.get("model", {})), kept.get("train", {})
        model_cfg = build(LongVQConfig, {**start, **model, "n_classes": n_classes, "vocab_size": vocab_size}, "model")
        return ClassifyConfig(model=model_cfg, train=build(ClassifyTrainConfig, {**start_train, **train}, "train"),
                              recipe=kept)

    cfg = applying_recipe(recipe, make)
    refuse_given(find_arch("classify", cfg.arch), {LongVQConfig: model, ClassifyTrainConfig: train}, run_context(cfg))
    return cfg


def applying_recipe(recipe: dict, make) -> ClassifyConfig:
    """``make(recipe)``, the config built with ``recipe``'s fields, less those that do not apply in it, where the
    same field given by the user is refused (:func:`~transformer_vq.config.arch.not_applying`: ``grad_clip`` under
    ``--optimizer adafactor``, which never reads it). Not refused, as the user did not give them, but left out, so
    that a run neither records nor announces a setting it never reads. Again until none is left out: a field left
    out can be the condition of another."""
    while True:
        cfg = make(recipe)
        arch, context = find_arch("classify", cfg.arch), run_context(cfg)
        unread = {name for cls, part in ((LongVQConfig, "model"), (ClassifyTrainConfig, "train"))
                  for name, _ in not_applying(arch, cls, recipe.get(part, {}), context)}
        if not unread:
            return cfg
        recipe = {part: {k: v for k, v in fields.items() if k not in unread} for part, fields in recipe.items()}


def preset_start(preset: str | None, recipe_model: dict) -> dict:
    """The model fields a new classifier starts from: ``preset`` (default ``small``) as an encoder, under the
    recipe's model fields."""
    return {**CLASSIFY_PRESETS[preset or DEFAULT_PRESET].to_dict(), "causal": False, **recipe_model}


def recipe_left(recipe: dict, model: dict | None, train: dict) -> dict:
    """The part of ``recipe`` (``{"model": ..., "train": ...}``, or empty) still in effect under the user's fields:
    the user's fields win, so they are not recorded as the recipe's; ``model`` None: none of its model fields is."""
    if not recipe:
        return {}
    return {"model": {k: v for k, v in recipe["model"].items() if model is not None and k not in model},
            "train": {k: v for k, v in recipe["train"].items() if k not in train}}


@dataclass(frozen=True)
class ClassifyEvalConfig:
    """Evaluate a classification checkpoint on a split of its dataset: accuracy, loss, per-class accuracy and the
    confusion matrix."""

    ckpt: str = option("runs/classify", "Run directory, its best/ directory, or one of its checkpoints/step_* "
                                        "directories.")
    split: str = option("test", "Split to evaluate.", choices=SPLITS)
    data_path: str | None = option(None, "Where the dataset is, when not where training found it.")
    batch_size: int | None = option(None, "Examples per forward call (none: the run's eval_batch_size).", min=1)
    plot: str | None = option(None, "Where to write the confusion-matrix PNG (none: confusion_<split>.png in the "
                                    "run directory).")
    device: str = option("auto", "'auto' (cuda when available), 'cpu' or 'cuda'.", choices=DEVICES)
    threads: int = threads_option()

    def __post_init__(self):
        problem = None if self.plot is None else png_path_problem(self.plot)
        check(self, [("plot", problem)] if problem else [])
