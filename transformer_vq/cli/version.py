"""`tvq version`: print the library, PyTorch and Python versions."""

from __future__ import annotations


def add_parser(subparsers):
    return subparsers.add_parser("version", help="print the installed versions", description=__doc__)


def run(args) -> int:
    import platform

    import torch

    import transformer_vq

    print(f"transformer-vq {transformer_vq.__version__}")
    print(f"torch {torch.__version__}")
    print(f"python {platform.python_version()}")
    return 0
