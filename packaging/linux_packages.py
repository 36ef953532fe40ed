"""The Linux packages of the bundle: a .deb (dpkg-deb, under /opt) and a .tar.gz; each redone only when stale."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
DIST = ROOT / "dist"
FINGERPRINT = BUILD / "bundle.fingerprint"
NAME = "inference-studio"
INSTALL_DIR = Path("opt") / NAME
HICOLOR_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
MAINTAINER = os.environ.get("DEB_MAINTAINER", "Inference Studio developers <inference-studio@users.noreply.invalid>")
DESCRIPTION = """\
desktop studio for running language models on your own workstation
 Inference Studio runs language models locally with a paged, continuous-batching
 inference engine: several chats stream at once through one engine, a live
 dashboard shows prefill and decode, KV-cache pages and tokens as they stream.
 It ships with an embedded default model (SmolLM2-135M-Instruct, Apache-2.0) and
 works offline from the first start. The same engine runs headless from the
 command line (inference-studio generate).
 .
 This package bundles its own Python, PyTorch (CPU build), Qt and transformers
 under /opt/inference-studio."""
# Libraries the bundle expects from the system that may be missing on the build machine (dpkg -S cannot name
# their package there): Qt's xcb platform plugin needs these since Qt 6.5.
KNOWN_PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libwayland-client.so.0": "libwayland-client0",
    "libwayland-cursor.so.0": "libwayland-cursor0",
    "libwayland-egl.so.1": "libwayland-egl1",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libGLX.so.0": "libglx0",
    "libfontconfig.so.1": "libfontconfig1",
    "libdbus-1.so.3": "libdbus-1-3",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb.so.1": "libxcb1",
}
GLIBC_SONAMES = re.compile(r"^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|ld-linux[-\w]*)\.so")

log = logging.getLogger("package")


def deb_architecture() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def deb_path(version: str) -> Path:
    return DIST / f"{NAME}_{version}_{deb_architecture()}.deb"


def tarball_path(version: str) -> Path:
    return DIST / f"{NAME}-{version}-linux-{os.uname().machine}.tar.gz"


def _stale(output: Path) -> bool:
    """An output is stale when the bundle (or this script) changed after it was made."""
    if not output.exists():
        return True
    newest = max(FINGERPRINT.stat().st_mtime, Path(__file__).stat().st_mtime)
    return output.stat().st_mtime < newest


def build_tarball(bundle: Path, version: str) -> Path:
    out = tarball_path(version)
    if not _stale(out):
        log.info("%s is up to date", out.name)
        return out
    log.info("writing %s", out.name)
    top = f"{NAME}-{version}"
    tmp = out.with_suffix(".part")
    compressor = "pigz -6" if shutil.which("pigz") else "gzip -6"
    command = ["tar", "--create", "--file", str(tmp), f"--use-compress-program={compressor}", "--sort=name"]
    command += ["--owner=0", "--group=0", "--numeric-owner", f"--transform=s,^{bundle.name},{top},"]
    command += ["-C", str(bundle.parent), bundle.name]
    subprocess.run(command, check=True)
    os.replace(tmp, out)
    return out


def build_deb(bundle: Path, icons: Path, version: str, compression: str = "xz") -> Path:
    out = deb_path(version)
    stamp = BUILD / "deb.compression"
    if not _stale(out) and stamp.exists() and stamp.read_text() == compression:
        log.info("%s is up to date", out.name)
        return out
    log.info("writing %s (%s; %s)", out.name, compression, "minutes" if compression == "xz" else "a minute")
    root = BUILD / "deb" / out.stem
    shutil.rmtree(root.parent, ignore_errors=True)
    stage_deb_tree(bundle, icons, root)
    write_control(root, version)
    tmp = out.with_suffix(".part")
    threads = max(1, (os.cpu_count() or 1))
    level = "-z6" if compression == "xz" else "-z12"  # zstd 12: 19 % larger than xz 6 at a tenth of the CPU
    command = ["dpkg-deb", "--root-owner-group", f"-Z{compression}", level, f"--threads-max={threads}", "--build"]
    subprocess.run([*command, str(root), str(tmp)], check=True, stdout=subprocess.DEVNULL)
    os.replace(tmp, out)
    stamp.write_text(compression)
    shutil.rmtree(root.parent, ignore_errors=True)
    return out


def stage_deb_tree(bundle: Path, icons: Path, root: Path) -> None:
    """/opt/inference-studio (the bundle), /usr/bin launcher, desktop entry, icons and copyright."""
    app_dir = root / INSTALL_DIR
    app_dir.parent.mkdir(parents=True)
    # hard links: the staging tree costs no space and no copy time
    shutil.copytree(bundle, app_dir, symlinks=True, copy_function=_link_or_copy)
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    # relative, so the launcher also works from a `dpkg -x` tree; the bootloader follows the link to its folder
    (bin_dir / NAME).symlink_to(Path("..") / ".." / INSTALL_DIR / NAME)
    share = root / "usr" / "share"
    _install(ROOT / "resources" / f"{NAME}.desktop", share / "applications" / f"{NAME}.desktop")
    _install(ROOT / "resources" / "icons" / f"{NAME}.svg", share / "icons/hicolor/scalable/apps" / f"{NAME}.svg")
    for size in HICOLOR_SIZES:
        _install(icons / f"{NAME}-{size}.png", share / f"icons/hicolor/{size}x{size}/apps/{NAME}.png")
    _install(ROOT / "packaging" / "linux" / "copyright", share / "doc" / NAME / "copyright")
    for path in [root, *root.rglob("*")]:  # dpkg keeps the modes it finds: make them the usual ones
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(0o755 if path.is_dir() or mode & 0o111 else 0o644)


def write_control(root: Path, version: str) -> None:
    installed_kib = sum(p.lstat().st_size for p in root.rglob("*") if p.is_file()) // 1024
    fields = {
        "Package": NAME,
        "Version": version,
        "Architecture": deb_architecture(),
        "Maintainer": MAINTAINER,
        "Installed-Size": str(installed_kib),
        "Depends": ", ".join(system_dependencies(root / INSTALL_DIR)),
        # a Secret Service for the keyring (hub token, API keys); fonts for Qt through fontconfig
        "Recommends": "gnome-keyring | org.freedesktop.secrets, fonts-dejavu-core | fonts-liberation2",
        "Section": "science",
        "Priority": "optional",
        "Description": DESCRIPTION,
    }
    debian = root / "DEBIAN"
    debian.mkdir()
    (debian / "control").write_text("".join(f"{key}: {value}\n" for key, value in fields.items()))


def system_dependencies(app_dir: Path) -> list[str]:
    """What dpkg-shlibdeps would say: the packages of the shared libraries the bundle needs but does not hold."""
    provided = {p.name for p in app_dir.rglob("*") if p.is_file() or p.is_symlink()}
    needed: set[str] = set()
    glibc = (2, 17)
    for path in app_dir.rglob("*"):
        if not path.is_file() or path.is_symlink() or not _is_elf(path):
            continue
        command = ["readelf", "--dynamic", "--version-info", "--wide", str(path)]
        text = subprocess.run(command, capture_output=True, text=True).stdout
        needed.update(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text))
        for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", text):
            glibc = max(glibc, (int(major), int(minor)))
    packages = {f"libc6 (>= {glibc[0]}.{glibc[1]})"}
    missing = []
    locations = _ldconfig_paths()
    for soname in sorted(needed - provided):
        if GLIBC_SONAMES.match(soname):
            continue
        package = _package_of(locations.get(soname)) or KNOWN_PACKAGES.get(soname)
        if package:
            packages.add(package)
        else:
            missing.append(soname)
    if missing:
        log.warning("no Debian package known for %s; add it to KNOWN_PACKAGES", ", ".join(missing))
    return sorted(packages)


def _is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


def _ldconfig_paths() -> dict[str, str]:
    text = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    paths: dict[str, str] = {}
    for soname, flags, path in re.findall(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", text, flags=re.M):
        if "x86-64" in flags or "64bit" in flags or os.uname().machine not in ("x86_64", "aarch64"):
            paths.setdefault(soname, path)
    return paths


def _package_of(path: str | None) -> str | None:
    if not path:
        return None
    real = os.path.realpath(path)
    # merged /usr: dpkg may have registered either spelling of the path
    candidates = {path, real} | {p.replace("/usr/lib/", "/lib/", 1) for p in (path, real) if p.startswith("/usr/lib/")}
    for candidate in sorted(candidates):
        result = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if result.returncode == 0:
            package = result.stdout.split(":", 1)[0].strip()
            return package.split(",")[0].strip()
    return None


def _install(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def _link_or_copy(source: str, target: str) -> str:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return target
