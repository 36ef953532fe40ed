"""The wheel built from the tree holds every package with Python files (a hand-kept list once dropped some)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "engine", "widgets", "resources")


def test_the_wheel_holds_every_package(tmp_path: Path) -> None:
    # built from a copy of the tree: setuptools' build/ folder in a checkout may hold modules since moved
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "tests")
    shutil.copytree(ROOT, source, ignore=ignore)
    out = tmp_path / "wheel"
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q"]
    build = subprocess.run([*command, "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("inference_studio-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {missing}"
    stale = sorted(n for n in names if n.endswith(".py") and n.split("/")[0] in PACKAGES and n not in expected)
    assert not stale, f"the wheel holds modules the tree no longer has: {stale}"
    assert "resources/icons/inference-studio.svg" in names
    assert "engine/model/csrc/decode_step.cpp" in names  # the compiled step builds from it on the user's machine
