"""`tvq doctor`: the versions this environment resolved, each against the range transformer-vq is tested with.

The ranges come from one place: the requirement specifiers of the installed transformer-vq (pyproject.toml's
dependencies and extras, as pip recorded them in the package's metadata). Versions are read from package metadata,
without importing the packages (transformers and triton take seconds to import); torch is imported for its view of
CUDA. A version outside its range, or a required package that is missing, is flagged (`OUT OF RANGE`, `MISSING`)
and summed up in one `warning:` line; the exit status is 0 unless --strict, which makes it 1."""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import platform
import sys

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

DIST = "transformer-vq"
# Listed first, in this order, whether or not installed; any other requirement of transformer-vq follows.
PACKAGES = ("torch", "transformers", "tokenizers", "huggingface-hub", "triton", "numpy", "safetensors",
            "sentencepiece", "scikit-learn", "lm-eval", "accelerate")
# lower bounds before upper bounds when a range is printed: `>=5.0,<6`
_OPERATOR_ORDER = ("===", "==", "~=", ">=", ">", "<=", "<", "!=")


@dataclasses.dataclass(frozen=True)
class Range:
    """What transformer-vq asks of a package: its specifiers, and whether the base install needs it."""

    specifier: SpecifierSet
    required: bool

    def __str__(self) -> str:
        specs = sorted(set(self.specifier), key=lambda s: (_OPERATOR_ORDER.index(s.operator), s.version))
        return ",".join(str(s) for s in specs)


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    version: str | None  # None: not installed
    range: Range | None  # None: transformer-vq states no range for it

    @property
    def status(self) -> str:
        if self.range is None:
            return ""
        if self.version is None:
            return "MISSING" if self.range.required else ""
        try:
            inside = self.range.specifier.contains(Version(self.version), prereleases=True)
        except InvalidVersion:
            inside = False
        return "ok" if inside else "OUT OF RANGE"

    @property
    def flagged(self) -> bool:
        return self.status in ("MISSING", "OUT OF RANGE")


def add_parser(subparsers):
    parser = subparsers.add_parser("doctor", help="print the installed versions against the tested ranges",
                                   description=__doc__)
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when a version is out of its range or a required package is missing")
    return parser


def installed_version(name: str) -> str | None:
    """The installed version of distribution NAME, from its metadata; None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def tested_ranges(requirements: list[str], extras: list[str]) -> dict[str, Range]:
    """Package name -> its range, from requirement strings such as 'transformers<6,>=5.0; extra == "hf"'. A package
    named by several extras gets the intersection of their ranges; a requirement whose marker holds for no extra on
    this machine (another platform's) is left out."""
    ranges: dict[str, Range] = {}
    for line in requirements:
        req = Requirement(line)
        required = req.marker is None or req.marker.evaluate({"extra": ""})
        if not (required or any(req.marker.evaluate({"extra": extra}) for extra in extras)):
            continue
        name = canonicalize_name(req.name)
        if name in ranges:
            ranges[name] = Range(ranges[name].specifier & req.specifier, ranges[name].required or required)
        else:
            ranges[name] = Range(req.specifier, required)
    return ranges


def collect_rows() -> list[Row]:
    """One row per package: transformer-vq, python, the PACKAGES, then transformer-vq's other requirements."""
    own = installed_version(DIST)
    if own is None:  # running from a source tree that pip never installed: no metadata, no ranges
        ranges, python_range = {}, None
    else:
        meta = metadata.metadata(DIST)
        ranges = tested_ranges(metadata.requires(DIST) or [], meta.get_all("Provides-Extra") or [])
        requires_python = meta.get("Requires-Python")
        python_range = Range(SpecifierSet(requires_python), True) if requires_python else None
    names = [*PACKAGES, *(name for name in ranges if name not in PACKAGES)]
    return [Row(DIST, own, None), Row("python", platform.python_version(), python_range),
            *(Row(name, installed_version(name), ranges.get(name)) for name in names)]


def format_row(row: Row) -> str:
    tested = f"(tested: {row.range})" if row.range is not None else ""
    return f"{row.name:<16} {row.version or 'not installed':<16} {tested:<24} {row.status}".rstrip()


def cuda_line() -> str:
    try:
        import torch
    except ImportError:
        return "cuda             unknown (torch is not installed)"
    if torch.version.cuda is None:
        return f"cuda             not available (torch {torch.__version__} is built without CUDA)"
    if not torch.cuda.is_available():
        return f"cuda             not available (torch built for CUDA {torch.version.cuda}; no usable device)"
    count = torch.cuda.device_count()
    return (f"cuda             available: {count} device{'s' * (count != 1)} (CUDA {torch.version.cuda}, "
            f"{torch.cuda.get_device_name(0)})")


def run(args) -> int:
    rows = collect_rows()
    for row in rows:
        print(format_row(row))
    print(cuda_line())
    print(f"platform         {platform.platform()} ({platform.machine()})")
    if rows[0].version is None:
        print(f"warning: {DIST} is not installed (pip install -e .), so its tested ranges are unknown",
              file=sys.stderr)
    flagged = [row for row in rows if row.flagged]
    if flagged:
        what = "; ".join(f"{row.name} {row.version or 'missing'} (tested: {row.range})" for row in flagged)
        print(f"{'error' if args.strict else 'warning'}: outside the tested ranges: {what}", file=sys.stderr)
    return 1 if flagged and args.strict else 0
