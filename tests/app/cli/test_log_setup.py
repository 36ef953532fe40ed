"""A warning that floods the log (bitsandbytes wrote one 41,580 times) is written once, then with its count."""

from __future__ import annotations

import subprocess
import sys

FLOOD = """
import logging, warnings
from app.cli.main import configure_logging
configure_logging(verbose=False)
log = logging.getLogger("bitsandbytes.autograd._functions")
for step in range(5000):
    log.warning("MatMul8bitLt: inputs will be cast from torch.float32 to float16 during quantization")
    with warnings.catch_warnings():  # what libraries do, and what resets Python's once-per-place rule
        warnings.simplefilter("default")
    warnings.warn("MatMul8bitLt: inputs will be cast from torch.float32 to float16 during quantization")
    if step % 1000 == 0:
        log.warning("step %d reached", step)  # different texts all pass
logging.getLogger("engine").info("info is not filtered")
log.error("a real error after the flood")
"""


def test_a_warning_emitted_5000_times_is_logged_once_with_its_count() -> None:
    result = subprocess.run([sys.executable, "-c", FLOOD], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    logged = [line for line in lines if line.startswith("WARNING bitsandbytes") and "MatMul8bitLt" in line]
    warned = [line for line in lines if line.startswith("WARNING py.warnings") and "MatMul8bitLt" in line]
    # once, then at 10, 100 and 1000 repeats: 4 lines each instead of 5000
    assert len(logged) == 4 and len(warned) == 4, result.stderr[-2000:]
    assert logged[0].endswith("during quantization") and "[repeated: 1000 times so far" in logged[-1]
    assert len([line for line in lines if "step" in line and "reached" in line]) == 5
    assert lines[-1] == "ERROR bitsandbytes.autograd._functions: a real error after the flood"
    assert len(lines) < 40
