"""The figures of ``tvq codebook``: per-layer usage histograms and usage over training, as PNG files and in the run's
TensorBoard log (``RUN/tb``, beside the training scalars)."""

from __future__ import annotations

from pathlib import Path

from transformer_vq import fileio


def usage_figure(report: dict):
    """One panel per layer (two units each): the share of every code, sorted from the largest, per codebook."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({u["unit"] // 2 for u in report["units"]})
    fig, axes = plt.subplots(len(layers), 1, figsize=(8, 2.6 * len(layers)), squeeze=False)
    for ax, layer in zip(axes[:, 0], layers):
        for u in (u for u in report["units"] if u["unit"] // 2 == layer):
            shares = sorted(u["shares"], reverse=True)
            ax.bar(range(len(shares)), shares, width=1.0, alpha=0.5,
                   label=f"unit {u['unit']} {u['kind']} g{u['group']}: ppl {u['perplexity']:.1f}, "
                         f"unused {u['unused']}/{u['codes']}")
            ax.axhline(1 / len(shares), color="gray", linewidth=0.8, linestyle="--")
        ax.set_ylabel(f"layer {layer}: code share")
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("code, sorted by share (dashed: uniform use)")
    fig.suptitle(f"codebook usage at step {report['step']}", fontsize=9)
    fig.tight_layout()
    return fig


def training_figure(curve: dict):
    """Usage perplexity and fraction of unused codes per step (mean over units), from ``metrics.jsonl``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ppl, unused) = plt.subplots(1, 2, figsize=(10, 3.8))
    ppl.plot(curve["steps"], curve["perplexity"], linewidth=1)
    unused.plot(curve["steps"], curve["unused"], linewidth=1, color="tab:red")
    ppl.set_ylabel("usage perplexity (last update)")
    unused.set_ylabel("fraction of codes unused (last update)")
    for ax in (ppl, unused):
        ax.set_xlabel("optimizer step")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def write_codebook_figures(report: dict, curve: dict, out: Path, run_dir: Path | None) -> dict[str, Path]:
    """Save ``codebook-usage.png`` (and ``codebook-training.png`` when the run logged steps) under ``out``; add them
    to the TensorBoard log of ``run_dir`` when given (tag ``codebook/...`` at the checkpoint's step)."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    figures = {"usage": usage_figure(report)}
    if curve["steps"]:
        figures["training"] = training_figure(curve)
    paths = {}
    for name, fig in figures.items():
        paths[name] = fileio.save_png(fig, out / f"codebook-{name}.png", dpi=110)
    if run_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tb"))
        for name, fig in figures.items():
            writer.add_figure(f"codebook/{name}", fig, report["step"], close=False)
        for u in report["units"]:
            tag = f"codebook/unit{u['unit']}_{u['kind']}{u['group']}"
            writer.add_scalar(f"{tag}_perplexity", u["perplexity"], report["step"])
            writer.add_scalar(f"{tag}_unused", u["unused"], report["step"])
        writer.close()
    for fig in figures.values():
        plt.close(fig)
    return paths
