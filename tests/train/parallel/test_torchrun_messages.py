"""What torchrun's workers say when a run cannot go on: one line for the whole run, not one per worker, and one that
works (a resume keeps its batch_size, so the way out of a batch the workers cannot share is another worker count)."""

from __future__ import annotations

from trainutil import tiny_config, torchrun
from transformer_vq.train import train


def test_a_resume_on_workers_that_cannot_share_its_batch_says_once_which_counts_can(corpus_file, tmp_path):
    run_dir = tmp_path / "run"
    assert train(tiny_config(corpus_file, run_dir, "batch_size=3", "steps=2")).exit_code == 0
    proc = torchrun(["train", "--resume", "auto", "--run-dir", str(run_dir), "--steps", "4"], check=False)
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert said == ["error: batch_size=3, which the resumed run keeps, must be a multiple of the number of "
                    "data-parallel workers (2): resume it with a number of workers that divides 3 (torchrun "
                    "--nproc_per_node 3) or in one process (without torchrun)"], proc.stderr[-3000:]
