"""Fixtures of the package's tests: the repository's root (the tests run
from it, so scenario paths read as in the README), and the command-line
``pdsim`` whose files the package's results are checked against."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="session")
def cli() -> Path:
    """The ``pdsim`` binary: ``PDSIM_BIN``, else the workspace's, built
    (dev profile, as ``cargo test`` leaves it) if it is not there."""
    given = os.environ.get("PDSIM_BIN")
    if given:
        return Path(given)
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no cargo on PATH to build the pdsim command line (set PDSIM_BIN)")
    subprocess.run([cargo, "build", "--quiet", "--bin", "pdsim"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "pdsim"


def pdsim_cli(cli: Path, *args: str) -> str:
    """Runs the command line from the repository's root; its stdout."""
    out = subprocess.run([str(cli), *args], cwd=ROOT, check=True, capture_output=True, text=True)
    return out.stdout
