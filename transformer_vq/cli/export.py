"""`tvq export`: convert a training run's model into a Hugging Face ``transformers`` directory (``--format hf``,
with its tokenizer and remote code: ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(DIR, trust_remote_code=False)`` load it anywhere the library is installed) or one
consolidated model.safetensors with the library's config.json (``--format safetensors``). The flags are the fields of
``transformer_vq.config.jobs.ExportConfig``."""

from __future__ import annotations


def add_parser(subparsers):
    from transformer_vq.config.flags import add_flags
    from transformer_vq.config.jobs import ExportConfig

    parser = subparsers.add_parser("export", help="convert a run's model for transformers or to safetensors",
                                   description=__doc__)
    add_flags(parser, ExportConfig)
    return parser


def run(args) -> int:
    from pathlib import Path

    from transformer_vq.config.flags import given, output_dir
    from transformer_vq.config.jobs import ExportConfig
    from transformer_vq.export import export

    cfg = ExportConfig(**given(args, ExportConfig))
    # a place where the directory cannot be made is refused by flag before the checkpoint is read, as every
    # command's --out is (the directory itself is made last, whole, under a temporary name beside it)
    output_dir(Path(cfg.out).parent, "--out")
    out = export(cfg)
    print(f"wrote {out} ({cfg.format})")
    return 0
