"""Before Qt loads: which system libraries Qt's X11 platform plugin lacks, and the command that installs them."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

# soname -> (Debian/Ubuntu package, Fedora/RHEL package): what Qt 6's xcb plugin links against beyond libc and Qt
XCB_LIBRARIES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
}

Loader = Callable[[str], object]
_NOT_FOUND = re.compile(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file")


def uses_xcb(environ: dict[str, str] | None = None) -> bool:
    """Whether Qt will pick its X11 (xcb) plugin: asked for, or an X display without a Wayland one."""
    env = os.environ if environ is None else environ
    platform = env.get("QT_QPA_PLATFORM", "").split(":")[0].split(";")[0]
    if platform:
        return platform == "xcb"
    return sys.platform.startswith("linux") and bool(env.get("DISPLAY")) and not env.get("WAYLAND_DISPLAY")


def xcb_plugin() -> Path | None:
    """Qt's X11 platform plugin, found without importing PySide6 (that would load Qt)."""
    roots = []
    bundle = getattr(sys, "_MEIPASS", None)  # PyInstaller's folder
    if bundle:
        roots.append(Path(bundle) / "PySide6")
    spec = importlib.util.find_spec("PySide6")
    if spec is not None and spec.submodule_search_locations:
        roots.extend(Path(p) for p in spec.submodule_search_locations)
    for root in roots:
        for plugins in (root / "Qt" / "plugins", root / "plugins"):
            plugin = plugins / "platforms" / "libqxcb.so"
            if plugin.is_file():
                return plugin
    return None


def _loads(load: Loader, name: str) -> str | None:
    """None if the library loads, else the error text."""
    try:
        load(name)
    except OSError as exc:
        return str(exc)
    return None


def missing_libraries(plugin: Path | None = None, load: Loader = ctypes.CDLL) -> list[str]:
    """Sonames Qt's xcb plugin needs that the system lacks. The plugin itself is loaded first (with its own
    search path, as Qt loads it): only when that fails are the system libraries tried one by one, so a bundle
    that carries some of them never gets a false alarm. [] when the plugin loads or can't be found."""
    plugin = plugin or xcb_plugin()
    if plugin is None:
        return []
    error = _loads(load, str(plugin))
    if error is None:
        return []
    missing = [name for name in XCB_LIBRARIES if _loads(load, name) is not None]
    first = _NOT_FOUND.search(error)
    if first and first.group(1) not in missing:
        missing.insert(0, first.group(1))
    return missing


def install_commands(missing: list[str]) -> list[str]:
    """The apt and dnf command lines that install the missing libraries."""
    apt = sorted({XCB_LIBRARIES[name][0] for name in missing if name in XCB_LIBRARIES})
    dnf = sorted({XCB_LIBRARIES[name][1] for name in missing if name in XCB_LIBRARIES})
    commands = []
    if apt:
        commands.append(f"sudo apt install {' '.join(apt)}")
    if dnf:
        commands.append(f"sudo dnf install {' '.join(dnf)}")
    return commands


def missing_libraries_message(missing: list[str]) -> str:
    commands = install_commands(missing)
    lines = [
        "inference-studio: the window can't open: Qt's X11 platform plugin needs system libraries that are missing: "
        + ", ".join(missing)
    ]
    if commands:
        lines.append(f"  Debian, Ubuntu:  {commands[0]}")
    if len(commands) > 1:
        lines.append(f"  Fedora, RHEL:    {commands[1]}")
    lines.append("  (the terminal commands `inference-studio generate` and `inference-studio serve` work without them)")
    return "\n".join(lines)
