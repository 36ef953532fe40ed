"""Replaces the contrib hook: a CPU torch build ships bitsandbytes' CPU (and Apple MPS) library, not its ~150 MB
of CUDA/ROCm/XPU ones, whose GPU runtimes a CPU build does not have anyway."""

import os

from PyInstaller.utils.hooks import collect_dynamic_libs

GPU_BACKENDS = ("cuda", "rocm", "xpu")
binaries = [
    (source, dest)
    for source, dest in collect_dynamic_libs("bitsandbytes")
    if os.environ.get("STUDIO_KEEP_GPU") == "1" or not any(gpu in os.path.basename(source) for gpu in GPU_BACKENDS)
]
# bitsandbytes reads its own source through triton's JIT on GPU builds
module_collection_mode = "pyz+py"
