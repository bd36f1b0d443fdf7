"""What ``tvq eval``, ``tvq sample`` and ``tvq export`` do with a checkpoint: frozen, validated configs whose fields
are the commands' flags and the keyword arguments of ``transformer_vq.train.evaluate`` / ``sample`` /
``transformer_vq.export.export``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from transformer_vq.config.applies import Above, Other, switch_problems
from transformer_vq.config.choices import DEVICES, EXPORT_FORMATS, IMAGE_CORPORA, SPLITS
from transformer_vq.config.fields import ConfigError, check, fields_of, option, unknown_message

# Evaluation scores each token from the ones before it: one token alone has nothing to score.
MIN_EVAL_TOKENS = 2

CKPT_HELP = "Run directory or one of its checkpoints/step_* directories."
TEXT = {"data": Other(*IMAGE_CORPORA)}
"""Where an option of text sampling applies: a model of a corpus of text (the run's ``data``)."""
IMAGES = {"data": IMAGE_CORPORA}
"""Where an option of image sampling applies: a model of a corpus of images."""
RANDOM = {"temperature": Above(0)}
"""Where an option of random sampling applies: temperature 0 is greedy, always the most likely token."""
DEVICE_HELP = "'auto' (cuda when available), 'cpu' or 'cuda'."


# A bound far above any machine's cores, below the thread counts that end a process without a message (100,000:
# a segfault, or "can't start new thread", when OpenMP starts its pool)
MAX_THREADS = 1024


def threads_option(help: str = "CPU threads for PyTorch (0 = PyTorch's default, one per core); see docs/training.md "
                                "on shared CPUs."):
    """The ``threads`` field of every job that computes (training, evaluation, sampling, an ablation's cells):
    PyTorch's CPU threads."""
    return option(0, help, min=0, max=MAX_THREADS)


@dataclass(frozen=True)
class EvalConfig:
    """Evaluate a checkpoint on a split of its corpus, the state carried within each of its sequences."""

    ckpt: str = option("runs/default", CKPT_HELP)
    split: str = option("validation", "Split to evaluate.", choices=SPLITS)
    data_path: str | None = option(None, "Where the corpus is, when not where training found it.")
    data_options: dict = option(factory=dict, help="Override a corpus loader option saved with the run, e.g. "
                                "tokenizer=other.model (repeatable KEY=VALUE).", flag="data-option")
    streams: int | None = option(None, "Contiguous pieces of the split evaluated side by side (none: the run's "
                                       "eval_streams; 1: the whole split as one sequence); an encoder's: windows "
                                       "per forward call, memory only.", min=1)
    max_tokens: int = option(0, "Evaluate only the first N tokens (0 = all).", min=0)
    window_len: int | None = option(None, "Tokens per forward call (none: the run's update_len): memory only for a "
                                          "causal model (the carried state makes the result independent of it); "
                                          "an encoder's context, which changes its score.", min=1)
    carry_tokens: int | None = option(None, "Reset the attention state every this many tokens of a stream (a "
                                             "multiple of window_len; none: the run's seq_len, the history the model "
                                             "was trained with, as training's validation and the authors' evaluation "
                                             "do; 0: carry it across the whole stream).", min=0)
    device: str = option("auto", DEVICE_HELP, choices=DEVICES)
    threads: int = threads_option()

    def __post_init__(self):
        check(self, [eval_tokens_problem("max_tokens", self.max_tokens)])


def eval_tokens_problem(name: str, value) -> tuple[str, str] | None:
    """The problem of a token budget of evaluation that is neither 0 (all) nor enough to score a token."""
    if isinstance(value, int) and 0 < value < MIN_EVAL_TOKENS:
        return name, f"must be 0 (all) or at least {MIN_EVAL_TOKENS} (a token is scored from the one before it), " \
                     f"got {value}"
    return None


@dataclass(frozen=True)
class SampleConfig:
    """Sample from a checkpoint: text token by token, or 64x64 images for an image model."""

    ckpt: str = option("runs/default", CKPT_HELP)
    prompt: str = option("\n", "Text to continue (text models).", applies=TEXT)
    max_new_tokens: int = option(500, "Tokens to generate (text models; 0 prints the prompt).", min=0, applies=TEXT)
    temperature: float = option(1.0, "Softmax temperature: 0 = greedy (always the most likely token).", min=0.0)
    top_k: int | None = option(None, "Sample among the k most likely tokens only (none or 0 = all, as in "
                                     "transformers; temperature above 0).", min=0, off=0, applies=RANDOM)
    top_p: float = option(1.0, "Nucleus: the smallest set of tokens with this probability (temperature above 0).",
                          min=0.0, max=1.0, min_open=True, applies=RANDOM)
    seed: int = option(0, "Same seed, same sample.", min=0)
    data_path: str | None = option(None, "Corpus location, for models with a corpus-specific tokenizer.")
    out: str | None = option(None, "Image models: directory for sample_NNN.png and grid.png (none: "
                                   "RUN_DIR/samples).", applies=IMAGES)
    num_samples: int = option(4, "Image models: images to sample, as one batch.", min=1, applies=IMAGES)
    device: str = option("auto", DEVICE_HELP, choices=DEVICES)
    threads: int = threads_option()

    def __post_init__(self):
        check(self, switch_problems(self, switches_only=False))


@dataclass(frozen=True)
class TokenizerConfig:
    """Train the PG-19 BPE tokenizer on the training books of a PG-19 tree."""

    data_path: str | None = option(None, "PG-19 root with train/, validation/ and test/ directories (required).")
    vocab_size: int = option(32000, "Number of pieces (32000 in the paper; the 256 byte pieces need at least "
                                    "300).", min=300)
    max_sentences: int = option(10_000_000, "Lines sampled for training, bounding memory (SentencePiece samples "
                                            "more than 100).", min=101)
    out: str | None = option(None, "Where to save the .model, a new file (an existing one is refused; none: the "
                                   "cache, where pg19 loading finds it).")
    cache_dir: str | None = option(None, "Cache root (none: $TVQ_CACHE_DIR or ~/.cache/transformer-vq); tvq train "
                                         "reads $TVQ_CACHE_DIR only: the next: line passes the file by path.")
    threads: int | None = option(None, "SentencePiece trainer threads (none: all CPUs).", min=1, max=MAX_THREADS)

    def __post_init__(self):
        check(self, [("data_path", "is required: pass the PG-19 root directory")] if self.data_path is None else [])


@dataclass(frozen=True)
class ExportConfig:
    """Convert a training run's model (weights and EMA codebooks) into a directory other tools load."""

    ckpt: str = option("runs/default", CKPT_HELP)
    format: str = option("hf", "'hf' (a transformers directory that stands alone: config.json with auto_map, "
                               "model.safetensors, generation_config.json, the tokenizer and the remote code; needs "
                               "the extra hf: `pip install -e '.[hf]'` in the checkout) or 'safetensors' "
                               "(model.safetensors and the library's config.json).", choices=EXPORT_FORMATS)
    out: str | None = option(None, "Directory to write (required; must not exist or be empty).")

    def __post_init__(self):
        check(self, [("out", "is required: pass the directory to write")] if self.out is None else [])


def job_config(cls, given, **options):
    """``given`` as a ``cls`` config: a config (with ``options`` applied) or a checkpoint path (with ``options``
    as the other fields); options that are None keep their value."""
    unknown = set(options) - set(fields_of(cls))
    if unknown:  # a misspelt keyword (max_token=) got dataclasses' bare TypeError
        raise ConfigError(unknown_message(unknown, cls.__name__, set(fields_of(cls)) - {"ckpt"}))
    options = {k: v for k, v in options.items() if v is not None}
    if isinstance(given, cls):
        return dataclasses.replace(given, **options) if options else given
    return cls(ckpt=str(given), **options)
