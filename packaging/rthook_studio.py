"""PyInstaller runtime hook: points the engine at the models the bundle ships already converted."""

import os
import sys

_converted = os.path.join(getattr(sys, "_MEIPASS", ""), "converted-models")
if os.path.isdir(_converted):
    # Appended, so a folder the user set (for a portable install) is searched first.
    _known = os.environ.get("INFERENCE_STUDIO_BUNDLED_CONVERTED", "")
    os.environ["INFERENCE_STUDIO_BUNDLED_CONVERTED"] = os.pathsep.join(p for p in (_known, _converted) if p)
