"""What torchrun's workers say when a run cannot go on: one line for the whole run, not one per worker, and one that
works (a resume keeps its batch_size, so the way out of a batch the workers cannot share is another worker count)."""

from __future__ import annotations

from pathlib import Path

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


def test_a_stalled_worker_holds_the_others_for_the_collective_timeout_then_one_line(tmp_path):
    """A worker that stalls (``kill -STOP``, a hung device) held the others in their next collective for the backend's
    30 minutes, with no option (helper-73 audit-dist2 F2). ``--collective-timeout`` sets the wait of every group the
    run creates, the context-parallel mesh's too (which does not inherit the default group's), and the timeout reads
    as one line."""
    worker = Path(__file__).with_name("stall_worker.py")
    out = torchrun([], entry=(str(worker),), check=False, timeout=120).stdout
    line = ("a collective between the workers of this torchrun run timed out after 2 s: another worker stalled "
            "(stopped, hung, or far slower); the last checkpoint resumes with --resume auto, and --collective-timeout "
            "SECONDS sets the wait")
    assert out.splitlines() == [f"default: waited 2 s; {line}", f"cp: waited 2 s; {line}"], out
