"""Building a run config from its sources: a model preset, an optional YAML/TOML file, ``key=value``
overrides (``--set``), and typed values (the command-line flags), each later source winning.

A config file has up to four top-level keys::

    arch: tvq                # the architecture: 'tvq' (default) or 'longvq' (transformer_vq.config.arch)
    preset: small            # a model preset of the architecture (transformer_vq.config.arch.LM_PRESETS)
    model: {d_model: 128}    # overrides of the architecture's model config fields
    train: {steps: 200}      # TrainConfig fields

Overrides are ``model.FIELD=VALUE`` or ``train.FIELD=VALUE``; a bare ``FIELD=VALUE`` works because a field
name belongs either to the model configs or to the training config. Unknown keys are rejected by name. TOML files
need Python >= 3.11 (``tomllib``) or the ``tomli`` package; YAML works everywhere.
"""

from __future__ import annotations

import typing
from pathlib import Path

from transformer_vq.config.arch import (ARCHS, DEFAULT_ARCH, check_trains, find_arch, foreign_fields, lm_preset,
                                        refuse_given, run_arch, run_context)
from transformer_vq.config.classify import ClassifyConfig
from transformer_vq.config.fields import ConfigError, build, fields_of, one_line, unknown_message
from transformer_vq.config.reading import UnreadableFile, read_json, read_text
from transformer_vq.config.train import RunConfig, TrainConfig

SECTIONS = ("model", "train")
MODEL_FIELDS = frozenset(name for a in ARCHS if a.task == "lm" for name in fields_of(a.config))
"""The fields of every architecture's model config (a bare ``--set`` key among them is a model field)."""

_shared = MODEL_FIELDS & set(fields_of(TrainConfig))
# `tvq train` has one flat flag per field of the configs: a name in both could not be told apart.
assert not _shared, f"model and train configs share field names {sorted(_shared)}"


def load_config(preset: str | None = None, file: str | Path | None = None,
                overrides: typing.Sequence[str] = (), base: RunConfig | None = None,
                values: dict | None = None, arch: str | None = None, shared: typing.Sequence[str] = (),
                arch_flag: bool = True) -> RunConfig:
    """Build a :class:`RunConfig`: model preset (default ``small``), then a YAML/TOML file, then ``key=value``
    ``overrides``, then typed ``values`` (``{"model": {...}, "train": {...}}``, e.g. parsed flags), each later
    source winning. ``arch`` (else the file's, else ``base``'s, else ``tvq``) picks the model config class and its
    presets. With ``base`` (e.g. the saved config of a run being resumed) the starting point is ``base``
    instead of the defaults; a named preset replaces its model fields only. An option given where it does not
    apply is refused (:func:`~transformer_vq.config.arch.refuse_given`), except the ``shared`` overrides (applied
    before ``overrides``): the options of a sweep, meant for the runs they apply to (``tvq ablate``'s matrix-wide
    ones). ``arch_flag`` False: the caller trains its one architecture (``tvq ablate``), so a field of another is
    refused without advising ``--arch``.
    Raises :class:`ConfigError` naming the bad key or value."""
    merged = {"model": {}, "train": dict(base.train.to_dict()) if base else {}}
    given = {section: set() for section in SECTIONS}  # the fields the user gave, checked for where they apply
    loaded = read_file(Path(file)) if file is not None else {}
    for section in SECTIONS:
        merged[section].update(loaded.get(section) or {})
        if "task" not in loaded:  # a run's saved config records every field, not only those that apply
            given[section].update(loaded.get(section) or {})
    for item in (*shared, *overrides):
        section, key, value = parse_override(item)
        merged[section][key] = value
        if item not in shared:
            given[section].add(key)
    unknown = sorted(set(values or {}) - set(SECTIONS))
    if unknown:  # as a config file's top-level keys are checked
        raise ConfigError(f"values: unknown section(s) {', '.join(map(repr, unknown))}; the sections are "
                          f"{', '.join(map(repr, SECTIONS))}")
    for section, typed in (values or {}).items():
        if not isinstance(typed, dict):
            raise ConfigError(f"values[{section!r}] must be a mapping of field: value, got {typed!r}")
        merged[section].update(typed)
        given[section].update(typed)
    name = preset or loaded.get("preset")
    arch = find_arch("lm", arch or loaded.get("arch") or (base.arch if base is not None else DEFAULT_ARCH)).name
    if base is not None and name is None and base.arch != arch:
        raise ConfigError(f"--arch: the run being resumed trained a {base.arch!r} model, not {arch!r}; leave --arch "
                          f"out to continue it, or start a new run with another --run-dir")
    start = base.model if base is not None and name is None else lm_preset(arch, name)
    foreign = foreign_fields(arch, merged["model"], arch_flag=arch_flag)
    if foreign:
        raise ConfigError(foreign)
    model_cls = find_arch("lm", arch).config
    cfg = RunConfig(model=build(model_cls, {**start.to_dict(), **merged["model"]}, "model"),
                    train=build(TrainConfig, merged["train"], "train"))
    refuse_given(find_arch("lm", arch), {model_cls: given["model"], TrainConfig: given["train"]}, run_context(cfg))
    return cfg



RESUME_HINT = ("restore it from config.json of one of the run's checkpoints/step_* directories, or delete it to "
               "resume with the config that the flags (and --preset) build")


def read_run_config(path: str | Path, task: str = "lm"):
    """A run's saved ``config.json``: a :class:`RunConfig` (``task`` "lm") or a
    :class:`~transformer_vq.config.ClassifyConfig` ("classify"). A damaged file is a :class:`ConfigError` naming it;
    a run of the other task is one naming the command that continues it."""
    path = Path(path)
    saved = read_json(path, "a run's saved config (config.json)", RESUME_HINT)
    try:
        arch = run_arch(saved)
    except ConfigError as err:
        raise ConfigError(f"{path} is not a valid run config ({err}); {RESUME_HINT}") from None
    check_trains(arch, task, path)  # a run of the other task is not damaged: the message names its command
    try:
        return (RunConfig if task == "lm" else ClassifyConfig).from_dict(saved)
    except (ValueError, TypeError, AttributeError) as err:
        raise ConfigError(f"{path} is not a valid run config ({err}); {RESUME_HINT}") from None


def resumed_config(run_dir: str | Path, task: str):
    """The saved config of the run in ``run_dir`` that the training command of ``task`` resumes (None when it has
    none yet: ``--resume auto`` then starts the run): the starting point of the resumed run's config, under the
    flags. A model preset replaces its model fields; its training fields stay the run's (``load_config`` and
    ``classify_config`` with ``base``), so a resumed run keeps its learning rate, clip, ... unless a flag changes
    them."""
    path = Path(run_dir) / "config.json"
    return read_run_config(path, task) if path.is_file() else None


def parse_data_options(items: typing.Sequence[str]) -> dict:
    """``["tokenizer=t.model", "fractions=[0.9, 0.05, 0.05]"]`` -> loader keyword options.

    Values are read as YAML scalars or flow lists (``4`` is an int, ``null`` is None, ``[a, b]`` a
    list), so they are saved in config.json with their types; anything else stays a string. A key
    given twice is refused, as a repeated value of the other list flags is: one of the two would be
    dropped without a word.
    """
    import yaml

    options, given = {}, {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():  # an empty value would silently be the default
            raise ConfigError(f"--data-option: {item!r} must look like KEY=VALUE, e.g. --data-option "
                              f"tokenizer=pg19.model")
        key = key.strip()
        if key in given:
            raise ConfigError(f"--data-option: {key} is given twice ({given[key]!r}, then {item!r}); give each key "
                              f"once")
        given[key] = item
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        # only what JSON can hold goes into config.json (YAML would also make dates and the like)
        if not isinstance(value, (str, int, float, bool, list, type(None))):
            value = text
        options[key] = value
    return options


CONFIG_FORMATS = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON", ".toml": "TOML"}


def _unique_key_loader():
    """YAML's safe loader, refusing a key given twice in one mapping (YAML itself keeps the last one silently: a
    second ``model:`` section would replace the first). Merge keys (``<<: *base``) are YAML's own: the keys they
    bring in are overridden by the mapping's, as YAML defines, and not counted as given twice; the merge key itself
    is a key like any other, refused given twice in one mapping (YAML keeps the last ``<<:``: the first mapping's keys
    were lost), with the advice of YAML's own form for several, ``<<: [*a, *b]``."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def flatten_mapping(self, node):
            # checked before YAML merges the keys in, once per node: an anchored mapping is flattened in place when
            # first met, and its merged keys would read as given twice when a shallower mapping merges it later
            if not getattr(node, "keys_checked", False):
                seen, merged = set(), False
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        if merged:
                            raise yaml.constructor.ConstructorError(
                                None, None, "merge key '<<' is given twice (only the last would be merged); "
                                "merge several mappings with one, '<<: [*a, *b]'", key_node.start_mark)
                        merged = True
                        continue
                    key = self.construct_object(key_node)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                                key_node.start_mark)
                    seen.add(key)
                node.keys_checked = True
            super().flatten_mapping(node)

    return UniqueKeyLoader


def read_file(path: Path) -> dict:
    """A config file's mapping, its top-level keys and sections checked."""
    try:
        text = read_text(path, f"a {CONFIG_FORMATS.get(path.suffix, 'YAML')} run config", "pass --config with "
                         "a text file of 'arch', 'preset', 'model' and 'train' keys (docs/training.md)")
    except UnreadableFile as err:
        raise ConfigError(f"--config: {err}") from None
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
            loaded = yaml.load(text, Loader=_unique_key_loader()) or {}
        except yaml.YAMLError as err:
            what = "JSON" if path.suffix == ".json" else "YAML"  # JSON is read as the YAML it is a subset of
            raise ConfigError(f"{path} is not valid {what}: {one_line(str(err))}") from None
    else:
        raise ConfigError(f"config file {path} must end in .yaml, .yml, .json or .toml")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping with 'arch', 'preset', 'model' and/or 'train' keys")
    # a run's saved config.json is a config file too (to start another run like it): it says its task
    if loaded.get("task", "lm") != "lm":
        raise ConfigError(f"--config: {path} is the config of a run of task {loaded['task']!r}, not a language "
                          f"model's; tvq classify train --resume continues such a run")
    unknown = sorted(set(loaded) - {"arch", "preset", "task", *SECTIONS})
    if unknown:
        raise ConfigError(f"unknown top-level key(s) in {path}: {', '.join(unknown)}; "
                          f"a config file has 'arch', 'preset', 'model' and 'train'")
    for section in SECTIONS:
        if not isinstance(loaded.get(section) or {}, dict):
            raise ConfigError(f"'{section}' in {path} must be a mapping of field: value, got {loaded[section]!r}")
    return loaded


def parse_override(item: str) -> tuple[str, str, str]:
    """'model.d_model=128' -> ('model', 'd_model', '128'); a bare key is looked up in both configs."""
    if "=" not in item:
        raise ConfigError(f"--set: {item!r} must look like KEY=VALUE, e.g. --set steps=100")
    key, value = item.split("=", 1)
    key = key.strip()
    if "." in key:
        section, name = key.split(".", 1)
        if section not in SECTIONS:
            raise ConfigError(f"--set: unknown config section {section!r} in {item!r}; use model.FIELD or "
                              f"train.FIELD")
        return section, name, value
    owner = "model" if key in MODEL_FIELDS else "train" if key in fields_of(TrainConfig) else None
    if owner is None:
        raise ConfigError(unknown_message([key], "config", MODEL_FIELDS | set(fields_of(TrainConfig))))
    return owner, key, value
