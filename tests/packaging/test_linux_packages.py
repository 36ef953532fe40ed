"""The installer scripts without a PyInstaller build: .deb layout and dependencies on a fake bundle, the smoke
test's stderr whitelist, the spec's version source. The real build is `make package` / `make package-test`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
sys.path.append(str(PACKAGING))  # appended: its build.py must not shadow anything

import linux_packages  # noqa: E402
import smoke_test  # noqa: E402

from app.version import __version__  # noqa: E402

needs_dpkg = pytest.mark.skipif(
    not (shutil.which("dpkg") and shutil.which("readelf") and shutil.which("dpkg-deb")), reason="not a Debian system"
)


@pytest.fixture
def fake_bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A bundle holding one real executable (for its ELF dependencies) and the icons the .deb installs."""
    bundle = tmp_path / "dist" / "inference-studio"
    (bundle / "_internal").mkdir(parents=True)
    shutil.copy2("/bin/true", bundle / "inference-studio")
    (bundle / "_internal" / "data.txt").write_text("model")
    (bundle / "_internal" / "data.txt").chmod(0o600)  # the package must normalise modes
    icons = tmp_path / "icons"
    icons.mkdir()
    for size in linux_packages.HICOLOR_SIZES:
        (icons / f"inference-studio-{size}.png").write_bytes(b"\x89PNG")
    return bundle, icons


@needs_dpkg
def test_deb_tree_installs_under_opt_with_launcher_entry_and_icons(tmp_path: Path, fake_bundle) -> None:
    bundle, icons = fake_bundle
    root = tmp_path / "root"
    linux_packages.stage_deb_tree(bundle, icons, root)
    linux_packages.write_control(root, __version__)

    launcher = root / "usr/bin/inference-studio"
    assert launcher.is_symlink() and not Path(launcher.readlink()).is_absolute()  # works in a dpkg -x root too
    assert launcher.resolve() == (root / "opt/inference-studio/inference-studio").resolve()
    assert (root / "usr/share/applications/inference-studio.desktop").is_file()
    assert (root / "usr/share/icons/hicolor/scalable/apps/inference-studio.svg").is_file()
    assert (root / "usr/share/icons/hicolor/256x256/apps/inference-studio.png").is_file()
    assert (root / "opt/inference-studio/_internal/data.txt").stat().st_mode & 0o777 == 0o644

    control = (root / "DEBIAN/control").read_text()
    assert f"Version: {__version__}\n" in control
    assert "Depends: libc6 (>= 2." in control  # found by reading the executable's ELF version needs
    deb = tmp_path / "studio.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True,
                   capture_output=True)  # fmt: skip
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True).stdout
    assert "root/root" in listing and "./opt/inference-studio/inference-studio" in listing


@needs_dpkg
def test_system_dependencies_name_packages_for_libraries_the_bundle_lacks(tmp_path: Path, fake_bundle) -> None:
    bundle, _ = fake_bundle
    shutil.copy2(shutil.which("dpkg"), bundle / "_internal" / "needs-more")  # links libraries beyond libc
    dependencies = linux_packages.system_dependencies(bundle)
    assert dependencies[0].startswith("libc6 (>= 2.")
    assert len(dependencies) > 1 and all(" " not in d or d.startswith("libc6") for d in dependencies)


def test_the_desktop_entry_starts_the_launcher() -> None:
    entry = (PACKAGING.parent / "resources" / "inference-studio.desktop").read_text()
    assert "\nExec=inference-studio\n" in entry and "\nIcon=inference-studio\n" in entry


def test_smoke_test_whitelist_is_narrow() -> None:
    assert smoke_test.harmless("This plugin does not support propagateSizeHints()")
    assert smoke_test.harmless("Converting and de-quantizing GGUF tensors...:  35%|███▍      | 95/272 [00:02<00:02]")
    for line in (
        "Traceback (most recent call last):",
        "ModuleNotFoundError: No module named 'torch.testing._internal'",
        'qt.qpa.plugin: Could not load the Qt platform plugin "xcb"',
        "WARNING: something else This plugin does not support propagateSizeHints()",
    ):
        assert not smoke_test.harmless(line), line


def test_png_size_reads_the_header(tmp_path: Path) -> None:
    png = tmp_path / "shot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + (1200).to_bytes(4, "big") + (780).to_bytes(4, "big"))
    assert smoke_test.png_size(png) == (1200, 780)
    (tmp_path / "junk.png").write_bytes(b"not a png at all, really not")
    with pytest.raises(smoke_test.Failure, match="not a PNG"):
        smoke_test.png_size(tmp_path / "junk.png")


def test_package_names_carry_the_single_version() -> None:
    assert linux_packages.tarball_path(__version__).name.startswith(f"inference-studio-{__version__}-linux-")
    spec = (PACKAGING / "inference-studio.spec").read_text()
    assert "from app.version import __version__" in spec
