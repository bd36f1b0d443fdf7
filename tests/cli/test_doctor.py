"""`tvq doctor`: each installed version against its range from transformer-vq's own metadata (pyproject.toml's
specifiers, as pip recorded them); a version out of range or a missing required package is flagged, and --strict
turns the flag into exit status 1."""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

import pytest
import torch

import transformer_vq
from transformer_vq.cli import doctor, main

REAL = doctor.installed_version


def _row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.split()[0] == name)


def _pretend(monkeypatch, **versions):
    """Make the version lookup answer VERSIONS (package -> version, None: not installed), the real one otherwise."""
    versions = {name.replace("_", "-"): version for name, version in versions.items()}
    monkeypatch.setattr(doctor, "installed_version", lambda name: versions[name] if name in versions else REAL(name))


@pytest.fixture(autouse=True)
def _no_source_tree(request, monkeypatch):
    """Outside the tests of the stale-range check, doctor sees no pyproject.toml: whether this checkout's is newer than
    what pip recorded (a `git pull` without a reinstall) is not what they check."""
    if "pyproject" not in request.node.name:  # the tests of the check name it
        monkeypatch.setattr(doctor, "source_requirements", lambda package: None)


def test_a_real_run_prints_the_installed_versions(capsys):
    # strict: what pip resolved from pyproject.toml lies inside pyproject.toml's ranges (local builds like +cpu too)
    assert main(["doctor", "--strict"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert _row(out, "imported") == f"imported         transformer_vq from {Path(transformer_vq.__file__).parent}"
    assert _row(out, "torch").split()[1] == torch.__version__
    assert _row(out, "transformer-vq").split()[1] == metadata.version("transformer-vq")
    assert _row(out, "lm-eval").split()[1] == (REAL("lm-eval") or "not")
    assert _row(out, "cuda").startswith("cuda             ")
    assert _row(out, "platform").startswith("platform         ")


def test_the_ranges_come_from_the_requirement_specifiers():
    ranges = doctor.tested_ranges(
        ["torch>=2.4", 'transformers<6,>=5.0; extra == "hf"', 'transformers>=5.1; extra == "test"',
         'pywin32>=300; sys_platform == "no-such-platform"', 'triton==3.9.0; extra == "triton"'],
        ["hf", "test", "triton"])
    assert {name: (str(r), r.required) for name, r in ranges.items()} == {
        "torch": (">=2.4", True), "transformers": (">=5.0,>=5.1,<6", False), "triton": ("==3.9.0", False)}


@pytest.mark.parametrize("strict, code, level", [(False, 0, "warning"), (True, 1, "error")], ids=["plain", "strict"])
def test_a_version_out_of_range_is_flagged(capsys, monkeypatch, strict, code, level):
    _pretend(monkeypatch, transformers="0.0.1")
    assert main(["doctor", *(["--strict"] if strict else [])]) == code
    out, err = capsys.readouterr()
    tested = _row(out, "transformers").split("(tested: ")[1].split(")")[0]
    assert _row(out, "transformers").split()[1] == "0.0.1" and _row(out, "transformers").endswith(" OUT OF RANGE")
    assert err == f"{level}: outside the tested ranges: transformers 0.0.1 (tested: {tested})\n"


def test_a_missing_required_package_is_flagged(capsys, monkeypatch):
    _pretend(monkeypatch, numpy=None, lm_eval=None)
    assert main(["doctor", "--strict"]) == 1
    out, err = capsys.readouterr()
    assert _row(out, "numpy").endswith(" MISSING")
    assert _row(out, "lm-eval").split()[1:3] == ["not", "installed"]  # optional: said, not flagged
    assert err.startswith("error: outside the tested ranges: numpy missing (tested: >=")



def _source_tree(tmp_path, monkeypatch, dependencies: str, extras: str = "") -> Path:
    """A source tree of transformer-vq at ``tmp_path`` whose pyproject.toml lists ``dependencies`` (TOML array items)
    and ``extras`` (TOML lines of [project.optional-dependencies]), as the package doctor imported."""
    pytest.importorskip("tomllib")  # Python 3.10 reads no TOML: doctor skips the check there
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "transformer-vq"\nrequires-python = ">=3.10"\ndependencies = [{dependencies}]\n'
        f"[project.optional-dependencies]\n{extras}\n")
    (tmp_path / "transformer_vq").mkdir()
    monkeypatch.setattr(doctor, "imported_package", lambda: tmp_path / "transformer_vq")
    return tmp_path


def test_a_pyproject_newer_than_the_installed_metadata_is_named(tmp_path, monkeypatch, capsys):
    """After `git pull` changes pyproject.toml without a reinstall, the ranges checked are stale: said, with both."""
    _source_tree(tmp_path, monkeypatch, '"torch>=99", "numpy>=1.24"')
    installed = doctor.tested_ranges(metadata.requires("transformer-vq"), [])["torch"]
    assert main(["doctor"]) == 0
    out, err = capsys.readouterr()
    assert _row(out, "imported") == f"imported         transformer_vq from {tmp_path / 'transformer_vq'}"
    warning = next(line for line in err.splitlines() if "pip recorded" in line)
    recorded, asked = warning.split(f"{tmp_path / 'pyproject.toml'} now asks ")
    assert f"torch {installed};" in recorded and "torch >=99;" in asked
    assert warning.startswith("warning: the ranges above") and \
        warning.endswith(f"`pip install -e .` in {tmp_path} refreshes them")
    # the table cannot be trusted: --strict fails (it passed: only flagged rows counted)
    assert main(["doctor", "--strict"]) == 1
    assert any(line.startswith("error: the ranges above") for line in capsys.readouterr().err.splitlines())


def test_a_pyproject_that_matches_the_metadata_gives_no_warning(tmp_path, monkeypatch):
    """The pyproject.toml form (extras in their own tables, markers beside them) and pip's metadata form compare
    equal: only a real difference is named."""
    root = _source_tree(tmp_path, monkeypatch, '"torch>=2.6"',
                        'hf = ["transformers>=5.0,<6"]\nwin = ["pywin32>=300; sys_platform == \'win32\'"]')
    requirements, extras, python = doctor.source_requirements(root / "transformer_vq")
    assert requirements == ["torch>=2.6", 'transformers<6,>=5.0; extra == "hf"',
                            'pywin32>=300; (sys_platform == "win32") and extra == "win"']
    assert (extras, python) == (["hf", "win"], ">=3.10")
    monkeypatch.setattr(doctor.metadata, "requires", lambda name: requirements)
    monkeypatch.setattr(doctor.metadata, "metadata", lambda name: _Metadata(python, extras))
    assert doctor.stale_ranges_warning(root / "transformer_vq") is None


class _Metadata:
    """The fields of a package's metadata doctor reads."""

    def __init__(self, requires_python: str, extras: list[str]):
        self.fields = {"Requires-Python": requires_python}
        self.extras = extras

    def get(self, key):
        return self.fields.get(key)

    def get_all(self, key):
        return self.extras if key == "Provides-Extra" else None
