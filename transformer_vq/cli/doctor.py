"""`tvq doctor`: the versions this environment resolved, each against the range transformer-vq is tested with.

The ranges come from one place: the requirement specifiers of the installed transformer-vq (pyproject.toml's
dependencies and extras, as pip recorded them in the package's metadata). Versions are read from package metadata,
without importing the packages (transformers and triton take seconds to import); torch is imported for its view of
CUDA. A version outside its range, or a required package that is missing, is flagged (`OUT OF RANGE`, `MISSING`)
and summed up in one `warning:` line; the exit status is 0 unless --strict, which makes it 1.

The ranges are pip's record of pyproject.toml at install time: when the imported transformer_vq sits in a source tree
whose pyproject.toml asks other ranges (a `git pull` after `pip install -e .`), a `warning:` line names both and the
reinstall that refreshes them. The path of the imported transformer_vq is printed too."""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import importlib.util
import platform
import sys
from pathlib import Path

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
                        help="exit with status 1 when a version is out of its range, a required package is missing, or "
                             "the ranges cannot be trusted (transformer-vq not installed, or its pyproject.toml "
                             "changed since)")
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


def imported_package() -> Path | None:
    """The directory of the transformer_vq this Python imports (a source tree or site-packages)."""
    spec = importlib.util.find_spec("transformer_vq")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def source_requirements(package: Path) -> tuple[list[str], list[str], str | None] | None:
    """``(requirements, extras, requires-python)`` of the pyproject.toml of the source tree holding ``package``, in
    the form of the installed metadata (an extra's requirement with ``extra == "..."`` in its marker); None outside
    a source tree of transformer-vq, or on Python 3.10, whose standard library reads no TOML (the check is skipped)."""
    try:
        import tomllib
    except ImportError:
        return None
    pyproject = package.parent / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    if canonicalize_name(project.get("name", "")) != DIST:
        return None
    lines = list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    for extra, requirements in extras.items():
        for line in requirements:
            req = Requirement(line)
            marker = f'({req.marker}) and extra == "{extra}"' if req.marker else f'extra == "{extra}"'
            req.marker = None
            lines.append(f"{req}; {marker}")
    return lines, list(extras), project.get("requires-python")


def _range_texts(requirements: list[str], extras: list[str], requires_python: str | None) -> dict[str, str]:
    texts = {name: f"{r}{'' if r.required else ' (extra)'}" for name, r in tested_ranges(requirements, extras).items()}
    texts["python"] = str(Range(SpecifierSet(requires_python or ""), True))
    return texts


def stale_ranges_warning(package: Path | None) -> str | None:
    """A warning when the ranges pip recorded differ from the pyproject.toml beside ``package`` (None when they agree,
    or when either is unknown): the ranges checked would be older, or newer, than the source being run."""
    source = None if package is None else source_requirements(package)
    if source is None or installed_version(DIST) is None:
        return None
    meta = metadata.metadata(DIST)
    installed = _range_texts(metadata.requires(DIST) or [], meta.get_all("Provides-Extra") or [],
                             meta.get("Requires-Python"))
    wanted = _range_texts(*source)
    changed = sorted(name for name in installed.keys() | wanted.keys() if installed.get(name) != wanted.get(name))
    if not changed:
        return None
    return (f"the ranges above are those pip recorded when {DIST} {installed_version(DIST)} was installed "
            f"({_listed(installed, changed)}), but {package.parent / 'pyproject.toml'} now asks "
            f"{_listed(wanted, changed)}: `pip install -e .` in {package.parent} refreshes them")


def _listed(texts: dict[str, str], names: list[str]) -> str:
    return "; ".join(f"{name} {texts.get(name, 'none')}" for name in names)


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
    package = imported_package()
    print(f"imported         transformer_vq from {package or 'nowhere (not importable)'}")
    level = "error" if args.strict else "warning"
    # each is a reason the table above cannot be trusted: --strict fails on any
    problems = [stale_ranges_warning(package)]
    if rows[0].version is None:
        problems.append(f"{DIST} is not installed (pip install -e .), so its tested ranges are unknown")
    flagged = [row for row in rows if row.flagged]
    if flagged:
        problems.append("outside the tested ranges: " + "; ".join(
            f"{row.name} {row.version or 'missing'} (tested: {row.range})" for row in flagged))
    for problem in filter(None, problems):
        print(f"{level}: {problem}", file=sys.stderr)
    return 1 if args.strict and any(problems) else 0
