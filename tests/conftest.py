"""Test-suite wide hooks: the suite spreads over the machine's cores (pytest-xdist, in the test extra); tests marked
``gpu`` need CUDA and are skipped on a machine without it; without CUDA, Triton kernels run under Triton's
interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Read when a Triton function is decorated, i.e. when triton.language is first imported (it holds jit'd helpers
    # such as tl.cdiv): it must be set before any test module, or anything they import, imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# More workers than this only add start-up and memory (about 1 GiB each with their torchrun children).
MAX_WORKERS = 8


def workers_wanted(config: pytest.Config) -> int:
    """How many processes a run spreads over when it names none (``-n``): one per CPU this process may use (at most
    MAX_WORKERS; PYTEST_XDIST_AUTO_NUM_WORKERS overrides), and one where that would get in the way: a CUDA device
    (its checks share it and some time it), --pdb, -s (output shown as it comes), --stepwise, --collect-only."""
    option = config.option
    if (torch.cuda.is_available() or option.usepdb or option.capture == "no" or option.collectonly
            or getattr(option, "stepwise", False) or getattr(option, "stepwise_skip", False)):
        return 1
    wanted = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    return int(wanted) if wanted and wanted.isdigit() else min(len(os.sched_getaffinity(0)), MAX_WORKERS)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``python -m pytest`` alone runs on every core: the suite is mostly single-threaded tiny models and processes
    that wait on each other (measured on 2 cores: 490 s against 704 s in one process). Files stay whole on one worker
    (--dist loadfile) so each module's fixtures are built once. Without pytest-xdist (``-p no:xdist``, or an
    environment without the test extra) nothing changes; ``-n 0`` runs everything in this process."""
    # a worker runs this hook too, with the controller's options and -n cleared: it must not spread again
    worker = hasattr(config, "workerinput")
    if worker or not config.pluginmanager.hasplugin("xdist") or config.option.numprocesses is not None:
        return
    workers = workers_wanted(config)
    if workers > 1:
        config.option.numprocesses = workers
        if config.option.dist == "no":
            config.option.dist = "loadfile"


def pytest_report_header(config: pytest.Config) -> str | None:
    workers = getattr(config.option, "numprocesses", None)
    if workers:
        return f"tests spread over {workers} processes (pytest-xdist, --dist {config.option.dist}); -n 0 runs them here"
    return None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker 'gpu'); none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
