"""Training configuration: a frozen, validated dataclass, and the loader that builds a run's config
from a model preset, an optional YAML/TOML file and ``key=value`` overrides.

A config file has up to three top-level keys::

    preset: small            # a model preset of transformer_vq.config.PRESETS
    model: {d_model: 128}    # overrides of TransformerVQConfig fields
    train: {steps: 200}      # TrainConfig fields

Overrides are ``model.FIELD=VALUE`` or ``train.FIELD=VALUE``; a bare ``FIELD=VALUE`` works when the
name belongs to exactly one of the two configs. Unknown keys are rejected by name. TOML files need
Python >= 3.11 (``tomllib``) or the ``tomli`` package; YAML works everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path

from transformer_vq.config import PRESETS, TransformerVQConfig

OPTIMIZERS = ("adamw", "adafactor")
PRECISIONS = ("float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")

# The paper's maximum learning rates (App. C.2), used when `lr` is left unset.
PAPER_LR = {"adamw": 4e-4, "adafactor": 1e-2}


class ConfigError(ValueError):
    """A configuration problem, with a message that says how to fix it."""


@dataclass(frozen=True)
class TrainConfig:
    """How to train: data, batches, optimizer, schedule, checkpoints, logging.

    The defaults train the ``small`` model on the Shakespeare corpus in about five minutes on a
    2-core CPU (see docs/training.md).
    """

    name: str = "default"
    """Run name; the run directory defaults to runs/<name>."""
    run_dir: str | None = None
    """Where checkpoints, metrics and TensorBoard events go (default runs/<name>)."""
    data: str = "shakespeare"
    """Corpus name for transformer_vq.data.load_corpus ('shakespeare', 'text', 'enwik8', ...)."""
    data_path: str | None = None
    """Local file or directory of the corpus (required for 'text')."""
    data_options: dict = dataclasses.field(default_factory=dict)
    """Keyword options of the corpus loader (e.g. tokenizer=PATH for pg19); on the command line --data-option KEY=VALUE."""
    seed: int = 0
    """Seeds the initialization, dropout and the data order."""
    batch_size: int = 8
    """Global batch size in sequences (summed over data-parallel workers)."""
    seq_len: int = 256
    """Tokens per sequence; the operator state is reset at the start of every batch of sequences."""
    update_len: int = 128
    """Backprop window W: one optimizer step per window of this many tokens (a multiple of block_len)."""
    steps: int = 800
    """Number of optimizer steps (windows) to train for."""
    optimizer: str = "adamw"
    """'adamw' or 'adafactor' (paper settings, App. C.2)."""
    lr: float | None = 2e-3
    """Peak learning rate. The default suits the small CPU models; none = the paper's value for the optimizer (4e-4 for adamw, 1e-2 for adafactor, App. C.2), meant for its 190M-1.3B models."""
    weight_decay: float = 0.0
    """Decoupled weight decay, applied only to parameters with more than one dimension."""
    warmup_steps: int = 50
    """Linear warmup steps, then cosine decay."""
    final_lr_ratio: float = 0.1
    """The cosine schedule ends at this fraction of the peak learning rate (the paper decays 10x)."""
    grad_clip: float = 0.1
    """Global gradient-norm clip for adamw (0 = off); adafactor clips its updates instead (d = 1)."""
    precision: str = "float32"
    """'float32' or 'bfloat16' (autocast of the computation, parameters stay float32)."""
    device: str = "auto"
    """'auto' (cuda when available), 'cpu' or 'cuda'."""
    threads: int = 0
    """CPU threads for PyTorch (0 = PyTorch's default, one per core); see docs/training.md on shared CPUs."""
    log_every: int = 10
    """Print a line every this many steps when not on a terminal (metrics.jsonl gets every step)."""
    eval_every: int = 0
    """Evaluate on the validation split every this many steps (0 = only at the end)."""
    eval_tokens: int = 0
    """Validation tokens per evaluation (0 = the whole split)."""
    eval_streams: int = 16
    """Evaluation splits the data into this many contiguous streams run as one batch, state carried."""
    ckpt_every: int = 200
    """Save a checkpoint every this many steps (and always at the end)."""
    keep_ckpts: int = 3
    """How many most recent checkpoints to keep."""
    max_nonfinite: int = 5
    """Stop when this many steps in a row have a non-finite loss or gradient."""
    sample_tokens: int = 300
    """Tokens to sample at the end of training (0 = none)."""
    sample_prompt: str = "\n"
    """Prompt of the end-of-training sample."""

    def __post_init__(self):
        errors = []
        for name in ("batch_size", "seq_len", "update_len", "steps", "log_every", "ckpt_every", "keep_ckpts",
                     "max_nonfinite", "eval_streams"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                errors.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("seed", "warmup_steps", "eval_every", "eval_tokens", "sample_tokens", "threads"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                errors.append(f"{name} must be an integer >= 0, got {value!r}")
        if self.optimizer not in OPTIMIZERS:
            errors.append(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            errors.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.device not in DEVICES:
            errors.append(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.lr is not None and not self.lr > 0:
            errors.append(f"lr must be > 0, got {self.lr!r}")
        if not self.weight_decay >= 0:
            errors.append(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0 <= self.final_lr_ratio <= 1:
            errors.append(f"final_lr_ratio must be in [0, 1], got {self.final_lr_ratio!r}")
        if not self.grad_clip >= 0:
            errors.append(f"grad_clip must be >= 0 (0 = off), got {self.grad_clip!r}")
        if _is_int(self.seq_len) and _is_int(self.update_len) and self.update_len >= 1:
            if self.seq_len % self.update_len != 0:
                errors.append(
                    f"seq_len={self.seq_len} must be a multiple of update_len={self.update_len}; "
                    f"set seq_len to a multiple such as {max(1, self.seq_len // self.update_len) * self.update_len}"
                )
        if not isinstance(self.data_options, dict) or not all(isinstance(k, str) for k in self.data_options):
            errors.append(f"data_options must be a mapping of option name to value (on the command line: "
                          f"--data-option KEY=VALUE), got {self.data_options!r}")
        if not self.name or "/" in self.name:
            errors.append(f"name must be a non-empty string without '/', got {self.name!r}")
        if errors:
            raise ConfigError("invalid train config: " + "; ".join(errors))

    @property
    def peak_lr(self) -> float:
        """The learning rate after warmup (the paper's default for the optimizer when unset)."""
        return self.lr if self.lr is not None else PAPER_LR[self.optimizer]

    @property
    def windows_per_batch(self) -> int:
        """Optimizer steps per batch of sequences (seq_len / update_len)."""
        return self.seq_len // self.update_len

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs: the model and how to train it. Saved as JSON with every checkpoint."""

    model: TransformerVQConfig = dataclasses.field(default_factory=lambda: PRESETS["small"])
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    def __post_init__(self):
        check_compatible(self.model, self.train)

    def to_dict(self) -> dict:
        return {"model": self.model.to_dict(), "train": self.train.to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """Rebuild from :meth:`to_dict` output (e.g. a checkpoint's config.json)."""
        unknown = sorted(set(values) - {"model", "train"})
        if unknown:
            raise ConfigError(f"unknown top-level config key(s): {', '.join(unknown)}; expected 'model' and 'train'")
        model = _build(TransformerVQConfig, values.get("model", {}), "model")
        train = _build(TrainConfig, values.get("train", {}), "train")
        return cls(model=model, train=train)


def check_compatible(model: TransformerVQConfig, train: TrainConfig) -> None:
    """The constraints that tie the training windows to the model's block length."""
    if train.update_len % model.block_len != 0:
        raise ConfigError(
            f"update_len={train.update_len} must be a multiple of the model's block_len={model.block_len}; "
            f"set train.update_len to e.g. {max(1, train.update_len // model.block_len) * model.block_len} "
            f"or change model.block_len"
        )


def load_config(preset: str | None = None, file: str | Path | None = None,
                overrides: typing.Sequence[str] = (), base: RunConfig | None = None) -> RunConfig:
    """Build a :class:`RunConfig`: model preset (default ``small``), then a YAML/TOML file, then
    ``key=value`` overrides, each later source winning. With ``base`` (e.g. the saved config of a run
    being resumed) the starting point is ``base`` instead of the defaults, unless a preset is named.
    Raises :class:`ConfigError` with a message that names the bad key or value."""
    values = {"model": {}, "train": dict(base.train.to_dict()) if base else {}}
    file_preset = None
    if file is not None:
        loaded = _read_file(Path(file))
        unknown = sorted(set(loaded) - {"preset", "model", "train"})
        if unknown:
            raise ConfigError(f"unknown top-level key(s) in {file}: {', '.join(unknown)}; "
                              f"a config file has 'preset', 'model' and 'train'")
        file_preset = loaded.get("preset")
        for section in ("model", "train"):
            part = loaded.get(section) or {}
            if not isinstance(part, dict):
                raise ConfigError(f"'{section}' in {file} must be a mapping of field: value, got {part!r}")
            values[section].update(part)
    for item in overrides:
        section, key, value = _parse_override(item)
        values[section][key] = value
    name = preset or file_preset
    if name is not None and name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; available: {', '.join(PRESETS)}")
    start = base.model if base is not None and name is None else PRESETS[name or "small"]
    model_values = {**start.to_dict(), **values["model"]}
    model = _build(TransformerVQConfig, model_values, "model")
    train = _build(TrainConfig, values["train"], "train")
    return RunConfig(model=model, train=train)


def parse_data_options(items: typing.Sequence[str]) -> dict:
    """``["tokenizer=t.model", "fractions=[0.9, 0.05, 0.05]"]`` -> loader keyword options.

    Values are read as YAML scalars or flow lists (``4`` is an int, ``null`` is None, ``[a, b]`` a
    list), so they are saved in config.json with their types; anything else stays a string.
    """
    import yaml

    options = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"data option {item!r} must look like KEY=VALUE, e.g. --data-option tokenizer=pg19.model")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        # only what JSON can hold goes into config.json (YAML would also make dates and the like)
        if not isinstance(value, (str, int, float, bool, list, type(None))):
            value = text
        options[key.strip()] = value
    return options


def field_docs(cls) -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body), for ``--help``."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def _read_file(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the path given to --config")
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise ConfigError(f"reading {path} needs Python >= 3.11 or `pip install tomli`; "
                                  f"or write the config as YAML") from None
        try:
            loaded = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from None
    elif path.suffix in (".yaml", ".yml", ".json"):
        import yaml

        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
    else:
        raise ConfigError(f"config file {path} must end in .yaml, .yml, .json or .toml")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping with 'preset', 'model' and/or 'train' keys")
    return loaded


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _parse_override(item: str) -> tuple[str, str, str]:
    """'model.d_model=128' -> ('model', 'd_model', '128'); a bare key is looked up in both configs."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value, e.g. --set train.steps=100")
    key, value = item.split("=", 1)
    key = key.strip()
    if "." in key:
        section, name = key.split(".", 1)
        if section not in ("model", "train"):
            raise ConfigError(f"unknown config section {section!r} in {item!r}; use model.FIELD or train.FIELD")
        return section, name, value
    owners = [s for s, cls in (("model", TransformerVQConfig), ("train", TrainConfig)) if key in _field_names(cls)]
    if len(owners) == 1:
        return owners[0], key, value
    if len(owners) == 2:
        raise ConfigError(f"{key!r} is both a model and a train field; write model.{key} or train.{key}")
    raise ConfigError(_unknown_message([key], "config", set(_field_names(TransformerVQConfig))
                                       | _field_names(TrainConfig)))


def _unknown_message(keys, what, known) -> str:
    return f"unknown {what} key(s): {', '.join(sorted(keys))}; known keys: {', '.join(sorted(known))}"


def _build(cls, values: dict, section: str):
    """Instantiate ``cls`` from ``values``, converting strings to each field's type."""
    known = _field_names(cls)
    unknown = set(values) - known
    if unknown:
        raise ConfigError(_unknown_message(unknown, f"{section} config", known))
    hints = typing.get_type_hints(cls)
    converted = {key: _convert(value, hints[key], f"{section}.{key}") for key, value in values.items()}
    try:
        return cls(**converted)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _convert(value, hint, key: str):
    """Convert an override string or file value to the field's type; bad values name the key."""
    optional = type(None) in typing.get_args(hint)
    base = next((t for t in typing.get_args(hint) if t is not type(None)), hint) if optional else hint
    if isinstance(value, str):
        text = value.strip()
        if optional and text.lower() in ("none", "null", ""):
            return None
        try:
            if base is bool:
                if text.lower() in ("true", "yes", "1", "on"):
                    return True
                if text.lower() in ("false", "no", "0", "off"):
                    return False
                raise ValueError
            if base is int:
                return int(text)
            if base is float:
                return float(text)
        except ValueError:
            raise ConfigError(f"{key} must be {base.__name__}, got {value!r}") from None
        return value
    if value is None and optional:
        return None
    if base is float and _is_int(value):
        return float(value)
    wrong_bool = base is bool and not isinstance(value, bool)
    wrong_other = base in (int, float, str) and (not isinstance(value, base) or isinstance(value, bool))
    if wrong_bool or wrong_other:
        raise ConfigError(f"{key} must be {base.__name__}, got {value!r}")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
