"""`make package`: the PyInstaller bundle in dist/, then the Linux .deb and .tar.gz; each step skipped when current."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.version import __version__  # noqa: E402  the single source of the version

PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "inference-studio.spec"
BUILD = ROOT / "build"
DIST = ROOT / "dist"
NAME = "inference-studio"
BUNDLE = DIST / NAME
FINGERPRINT = BUILD / "bundle.fingerprint"
# What the bundle is made of: a change in any of these rebuilds it; nothing else does.
SOURCES = ("app", "engine", "widgets", "resources")
BUNDLE_INPUTS = (SPEC, PACKAGING / "launcher.py", PACKAGING / "icons.py")

log = logging.getLogger("package")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-gpu", action="store_true", help="keep bitsandbytes' GPU libraries (GPU torch builds)")
    parser.add_argument("--force", action="store_true", help="rebuild the bundle even if its inputs did not change")
    parser.add_argument("--bundle-only", action="store_true", help="stop after the bundle (no .deb / .tar.gz)")
    parser.add_argument(
        "--deb-compression",
        choices=("xz", "zstd"),
        default=os.environ.get("DEB_COMPRESSION", "xz") or "xz",
        help="xz: smallest, ~10 min of CPU (releases); zstd: ~20%% larger, ten times faster (trying things out)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="package: %(message)s")

    started = time.monotonic()
    icons = render_icons()
    build_bundle(icons, keep_gpu=args.keep_gpu, force=args.force)
    outputs = [BUNDLE]
    if sys.platform.startswith("linux") and not args.bundle_only:
        from linux_packages import build_deb, build_tarball

        outputs += [build_tarball(BUNDLE, __version__), build_deb(BUNDLE, icons, __version__, args.deb_compression)]
    for path in outputs:
        log.info("%-60s %s", path.relative_to(ROOT), human_size(path))
    log.info("done in %.0f s", time.monotonic() - started)
    return 0


def render_icons() -> Path:
    out = BUILD / "icons"
    svg = ROOT / "resources" / "icons" / "inference-studio.svg"
    stamp = out / "inference-studio.icns"
    if not stamp.exists() or stamp.stat().st_mtime < max(svg.stat().st_mtime, (PACKAGING / "icons.py").stat().st_mtime):
        # in a child process: Qt's application object must not outlive into PyInstaller's run
        run([sys.executable, str(PACKAGING / "icons.py"), str(out)], quiet=True)
    return out


def bundle_fingerprint(icons: Path, keep_gpu: bool) -> str:
    digest = hashlib.sha256()
    files = [*BUNDLE_INPUTS, icons / "inference-studio.icns"]
    for source in SOURCES:
        files += [p for p in sorted((ROOT / source).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    # the build environment: every installed distribution and the interpreter
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update(json.dumps([sys.version, platform.machine(), dists, keep_gpu]).encode())
    return digest.hexdigest()


def build_bundle(icons: Path, *, keep_gpu: bool, force: bool) -> None:
    fingerprint = bundle_fingerprint(icons, keep_gpu)
    executable = BUNDLE / (NAME + (".exe" if sys.platform == "win32" else ""))
    if not force and executable.exists() and FINGERPRINT.exists() and FINGERPRINT.read_text() == fingerprint:
        log.info("bundle is up to date (%s)", BUNDLE.relative_to(ROOT))
        return
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        raise SystemExit("package: PyInstaller is not installed; run `make package` (it installs it)") from None
    env = {**os.environ, "STUDIO_ICON_DIR": str(icons), "STUDIO_KEEP_GPU": "1" if keep_gpu else "0"}
    BUILD.mkdir(exist_ok=True)
    FINGERPRINT.unlink(missing_ok=True)
    log.info("building the bundle with PyInstaller (minutes; the log is build/pyinstaller.log)")
    started = time.monotonic()
    command = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN"]
    command += ["--distpath", str(DIST), "--workpath", str(BUILD / "pyinstaller"), str(SPEC)]
    with (BUILD / "pyinstaller.log").open("w") as output:
        result = subprocess.run(command, env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.stderr.write((BUILD / "pyinstaller.log").read_text()[-6000:])
        raise SystemExit(f"package: PyInstaller failed (exit {result.returncode}); see build/pyinstaller.log")
    FINGERPRINT.write_text(fingerprint)
    log.info("bundle built in %.0f s", time.monotonic() - started)


def run(command: list[str], quiet: bool = False, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=quiet, text=True, **kwargs)
    if result.returncode != 0:
        if quiet:
            sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"package: {' '.join(map(str, command[:3]))} ... failed (exit {result.returncode})")
    return result


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def human_size(path: Path) -> str:
    return f"{tree_size(path) / 1024**2:,.0f} MiB"


if __name__ == "__main__":
    sys.exit(main())
