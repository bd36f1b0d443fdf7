"""CI runs what the README tells a new user to run: its test command, verbatim, as one line of .ci/run; and the
README's oldest-transformers check pins the lower bound that .ci/run derives from pyproject.toml's `hf` extra."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_ci_runs_the_readme_test_command_verbatim():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, flags=re.DOTALL)
    command = next(block for block in blocks if "pytest" in block)  # the first: "The tests:"
    assert "\n" not in command and "tvq doctor" in command and command.endswith("python -m pytest")
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert any(line == command or line.startswith(command + " ") for line in lines), command


def test_the_readme_oldest_transformers_is_the_hf_extras_floor():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["hf"]
    transformers = next(req for req in map(Requirement, extra) if req.name == "transformers")
    floor = next(spec.version for spec in transformers.specifier if spec.operator == ">=")
    pinned = re.findall(r'"transformers==([^"]+)"', README)
    assert pinned and all(Version(pin) == Version(floor) for pin in pinned), (floor, pinned)
