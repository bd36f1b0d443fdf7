"""`tvq demo`: a one-minute tour of the library on random weights.

Builds a small model, checks that the linear-time and quadratic paths give the same logits, that a
sequence fed in windows with the state carried gives the same logits as fed whole, and samples tokens.
"""

from __future__ import annotations

MEMORY_HINT = "use a smaller --length or --preset"


def add_parser(subparsers):
    from transformer_vq.config import SampleConfig
    from transformer_vq.config.fields import fields_of
    from transformer_vq.config.flags import add_flags, add_preset_flag, int_at_least

    parser = subparsers.add_parser("demo", help="build a small model, compare the linear and quadratic paths, sample",
                                   description=__doc__)
    add_preset_flag(parser, "small")
    parser.set_defaults(preset="small")
    parser.add_argument("--length", type=int_at_least(2, "the sequence is also fed as two windows"), default=300,
                        help="tokens in the test sequence, at least 2: it is also split in two windows (default: 300)")
    # tvq sample's --seed, so that its values are checked as every command's seed is (an integer >= 0)
    add_flags(parser, SampleConfig, skip=tuple(name for name in fields_of(SampleConfig) if name != "seed"))
    return parser


def run(args) -> int:
    import time

    import torch

    from transformer_vq import TransformerVQ, preset
    from transformer_vq.config import SampleConfig
    from transformer_vq.config.flags import given

    seed = given(args, SampleConfig).get("seed", SampleConfig.seed)
    torch.manual_seed(seed)
    cfg = preset(args.preset)
    model = TransformerVQ(cfg).eval()
    print(f"model: preset {args.preset!r}, {model.num_parameters():,} parameters, "
          f"{2 * cfg.n_layers} GAUs, S={cfg.n_code}, L={cfg.block_len}")
    ids = torch.randint(0, cfg.vocab_size, (1, args.length))
    with torch.no_grad():
        start = time.perf_counter()
        linear = model(ids).logits
        t_linear = time.perf_counter() - start
        start = time.perf_counter()
        quadratic = model(ids, attention="quadratic").logits
        t_quadratic = time.perf_counter() - start
        half = args.length // 2
        first = model(ids[:, :half])
        second = model(ids[:, half:], first.state)
        windows = torch.cat([first.logits, second.logits], dim=1)
    print(f"linear vs quadratic logits: max |diff| = {(linear - quadratic).abs().max():.2e} "
          f"({t_linear * 1e3:.0f} ms vs {t_quadratic * 1e3:.0f} ms for {args.length} tokens)")
    print(f"two windows with state vs whole: max |diff| = {(windows - linear).abs().max():.2e}")
    sample = model.generate(ids[:, :1], 32, temperature=1.0, top_p=0.9,
                            generator=torch.Generator().manual_seed(seed))
    print(f"sampled token ids (random weights): {sample[0, 1:].tolist()}")
    return 0
