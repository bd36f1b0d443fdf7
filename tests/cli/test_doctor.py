"""`tvq doctor`: each installed version against its range from transformer-vq's own metadata (pyproject.toml's
specifiers, as pip recorded them); a version out of range or a missing required package is flagged, and --strict
turns the flag into exit status 1."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
import torch

from transformer_vq.cli import doctor, main

REAL = doctor.installed_version


def _row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.split()[0] == name)


def _pretend(monkeypatch, **versions):
    """Make the version lookup answer VERSIONS (package -> version, None: not installed), the real one otherwise."""
    versions = {name.replace("_", "-"): version for name, version in versions.items()}
    monkeypatch.setattr(doctor, "installed_version", lambda name: versions[name] if name in versions else REAL(name))


def test_a_real_run_prints_the_installed_versions(capsys):
    # strict: what pip resolved from pyproject.toml lies inside pyproject.toml's ranges (local builds like +cpu too)
    assert main(["doctor", "--strict"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
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

