"""engine/cxx_build.py with fake compilers: a library published whole or not at all, failures said in a line."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cxx_build import BuildFailed, build_library


def _compiler(tmp_path: Path, body: str) -> str:
    """A shell script called as `compiler source -o partial flags...`."""
    script = tmp_path / "cxx"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_a_build_is_published_with_its_warnings(tmp_path: Path) -> None:
    compiler = _compiler(tmp_path, 'echo "a.cpp:3: warning: unused" >&2\necho built > "$3"\n')
    target = tmp_path / "cache" / "lib.so"
    record = tmp_path / "cache" / "lib.warnings"
    warnings = build_library(compiler, tmp_path / "a.cpp", ["-O3"], target, 30, record)
    assert warnings == ["a.cpp:3: warning: unused"]
    assert target.read_text() == "built\n"
    assert record.read_text() == "a.cpp:3: warning: unused"
    assert sorted(p.name for p in target.parent.iterdir()) == ["lib.so", "lib.warnings"]  # no partial file left


def test_a_failed_build_says_its_first_error_and_leaves_nothing(tmp_path: Path) -> None:
    compiler = _compiler(tmp_path, 'echo half > "$3"\necho "note: x" >&2\necho "a.cpp:1: error: no" >&2\nexit 1\n')
    target = tmp_path / "cache" / "lib.so"
    with pytest.raises(BuildFailed, match=r"^failed: a.cpp:1: error: no$"):
        build_library(compiler, tmp_path / "a.cpp", [], target, 30)
    assert not list(target.parent.iterdir())


def test_a_build_past_its_limit_is_stopped(tmp_path: Path) -> None:
    compiler = _compiler(tmp_path, 'echo half > "$3"\nexec sleep 30\n')
    target = tmp_path / "cache" / "lib.so"
    with pytest.raises(BuildFailed, match=r"^took over 0.5 s$"):
        build_library(compiler, tmp_path / "a.cpp", [], target, 0.5)
    assert not list(target.parent.iterdir())


def test_a_compiler_that_does_not_run_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        build_library(str(tmp_path / "missing"), tmp_path / "a.cpp", [], tmp_path / "lib.so", 30)
