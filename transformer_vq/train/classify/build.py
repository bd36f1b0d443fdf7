"""What a classification job builds from its config or a checkpoint: the dataset, the classifier of the configured
``arch``, and a classifier rebuilt from a checkpoint alone (docs/longvq.md, "Classification")."""

from __future__ import annotations

import torch

from transformer_vq.config import ClassifyConfig, ClassifyTrainConfig, ConfigError
from transformer_vq.config.arch import check_serves, find_arch
from transformer_vq.train.checkpoint.resume import check_same_data
from transformer_vq.train.checkpoint.store import Checkpoint, find_checkpoint, run_dir_of
from transformer_vq.train.device import resolve_device
from transformer_vq.train.models import instantiate


def load_classify_data(train_cfg: ClassifyTrainConfig, *, data_path: str | None = None):
    """The :class:`~transformer_vq.data.classify.ClassificationData` a training config names (``data_path``
    overrides the configured one)."""
    from transformer_vq.data.classify import load_classification

    path = data_path if data_path is not None else train_cfg.data_path
    return load_classification(train_cfg.data, data_path=path, **train_cfg.data_options)


def check_data_fits(cfg: ClassifyConfig, data) -> None:
    """Refuse a model whose classes or vocabulary differ from the dataset's (:class:`ConfigError`)."""
    model = cfg.model
    if model.n_classes != data.n_classes or model.vocab_size < data.vocab_size:
        raise ConfigError(f"the model (n_classes {model.n_classes}, vocab_size {model.vocab_size}) does not fit "
                          f"dataset {data.name!r} ({data.n_classes} classes, {data.vocab_size} token ids); build the "
                          f"config with transformer_vq.config.classify_config from the dataset's sizes")


def check_data_named(train_cfg: ClassifyTrainConfig, data) -> None:
    """Refuse (:class:`ConfigError`) a loaded dataset other than the one ``train_cfg`` names (its ``data``,
    ``data_path`` and ``data_options``): a run records its config's dataset, and evaluates and resumes on it."""
    from transformer_vq.data.classify import dataset_identity

    named = dataset_identity(train_cfg.data, train_cfg.data_path, train_cfg.data_options)
    if data.identity == named:
        return
    if data.identity is None:
        given = f"{data.name!r}, built by hand (not by load_classification),"
    else:
        given = describe_data(data.identity, named)
    raise ConfigError(f"data: the dataset given is {given} and the config names {describe_data(named, data.identity)}; "
                      f"a run records its config's dataset, and evaluates and resumes on it: pass the dataset that "
                      f"load_classify_data(cfg.train) loads (or none), or set cfg.train's data, data_path and "
                      f"data_options to the dataset's")


def describe_data(identity: dict, other: dict | None) -> str:
    """Dataset ``identity`` in words, with what differs from dataset ``other`` (of the same name): "'digits' with
    seed 5, test_size 100"."""
    if other is None or identity["data"] != other["data"]:
        return repr(identity["data"])
    differ = [f"{k} {v!r}" for k, v in identity["data_options"].items() if other["data_options"].get(k) != v]
    if identity["data_path"] != other["data_path"]:
        differ.insert(0, f"data_path {identity['data_path']!r}")
    return f"{identity['data']!r} with {', '.join(differ)}"


SAMPLED_EXAMPLES = 64
"""A dataset's fingerprint reads the tokens of this many evenly spaced examples of each split."""


def dataset_fingerprint(data) -> dict:
    """What identifies a classification dataset's examples, small enough to save in every checkpoint: its name, each
    split's number of examples and a SHA-256 of every label and length and of the tokens of evenly spaced examples
    (milliseconds on 100,000 examples: a few bytes an example, and 64 examples' tokens a split). A resumed run
    compares it with its checkpoint's (:func:`~transformer_vq.train.checkpoint.resume.check_same_data`, as a language
    model's corpus, :func:`~transformer_vq.data.corpus.corpus_fingerprint`), so that it continues on the dataset it
    was trained on: a release moved to another path is the same, another one (or a generated dataset where a release
    was read) is not. Sampled, so an edit inside an unsampled example that keeps its length and label can pass."""
    import hashlib

    import numpy as np

    digest, sizes = hashlib.sha256(), {}
    for name in sorted(data.splits):
        examples = data.splits[name]
        sizes[name] = len(examples)
        digest.update(name.encode())
        for column in (examples.labels, examples.lengths):
            digest.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
        for index in np.unique(np.linspace(0, len(examples) - 1, num=SAMPLED_EXAMPLES, dtype=np.int64)):
            digest.update(np.ascontiguousarray(examples[int(index)][0], dtype=np.int64).tobytes())
    return {"name": data.name, "examples": sizes, "sample_sha256": digest.hexdigest()}


def dataset_record(data, data_path) -> dict:
    """What a run saves in its checkpoints (latest and best) of the dataset ``data`` it read from ``data_path``
    (None: generated, fetched or bundled): :func:`dataset_fingerprint`, ``data_path`` and whether the loader
    generated the examples (a release read from a path is never the same)."""
    return {**dataset_fingerprint(data), "data_path": data_path, "generated": bool(data.metadata.get("generated"))}


def refuse_data_path_of_generated(ckpt: Checkpoint, data_path) -> None:
    """Refuse (:class:`ConfigError`) ``tvq classify eval --data-path`` on a run whose checkpoint records generated
    data, before anything is read: the path would name a release (other examples), and the loader would refuse the
    run's generation options as if eval had been given them."""
    record = ckpt.state.get("dataset") or {}
    if data_path is not None and record.get("generated"):
        raise ConfigError(f"--data-path: the run in {run_dir_of(ckpt)} generated its {record['name']} data (it was "
                          f"trained without --data-path), and {data_path} would be read as a release, other "
                          f"examples; leave --data-path out to score the run on its own data")


def check_eval_dataset(ckpt: Checkpoint, data, data_path) -> None:
    """Refuse (:class:`ConfigError`) to score a checkpoint on a dataset read from ``data_path`` other than the one
    it recorded, by the check a resume makes (:func:`check_same_data`: the same release moved elsewhere passes).
    Nothing to compare without ``data_path`` (the run's own) or in a checkpoint of before the record was saved."""
    saved = ckpt.state.get("dataset")
    if data_path is None or saved is None:
        return
    check_same_data(saved, dataset_record(data, data_path), run_dir_of(ckpt), noun="dataset", unit="examples",
                    reader="eval")


def build_classifier(cfg: ClassifyConfig) -> torch.nn.Module:
    """The classifier ``cfg.train.arch`` names (the registry's, :mod:`transformer_vq.config.arch`), built from
    ``cfg.model``."""
    return instantiate(find_arch("classify", cfg.train.arch), cfg.model)


def classify_config_of(ckpt: Checkpoint) -> ClassifyConfig:
    """The run config saved in a checkpoint, refused clearly when the checkpoint is not a classifier's."""
    check_serves(ckpt.config, "classify eval", ckpt.path)
    return ClassifyConfig.from_dict(ckpt.config)


def classifier_from_checkpoint(path: str, *, device: str = "auto") -> tuple[torch.nn.Module, ClassifyConfig,
                                                                               Checkpoint]:
    """The classifier of a checkpoint (run directory, its ``best/`` or a checkpoint directory) with its weights, in
    eval mode on ``device``, plus its run config and the checkpoint."""
    ckpt = find_checkpoint(path)
    cfg = classify_config_of(ckpt)
    model = build_classifier(cfg)
    ckpt.load_weights(model)
    return model.to(resolve_device(device)).eval(), cfg, ckpt

