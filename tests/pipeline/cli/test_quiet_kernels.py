"""torchao's "Failed to load ..._C_mxfp8...so" warnings (optional kernels this install cannot load) stay off the
console of every command (issue 46: they reached it on the hf: path, before a study's third-party log)."""

from __future__ import annotations

import logging
import subprocess
import sys

from paretorch.pipeline.cli.main import OPTIONAL_KERNEL_LOGGERS, quiet_optional_kernels

IMPORT = "import torchao"


def stderr_of(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=True).stderr


def test_the_optional_kernel_loggers_are_quiet_before_anything_imports_them() -> None:
    quiet_optional_kernels()
    assert all(logging.getLogger(name).getEffectiveLevel() >= logging.ERROR for name in OPTIONAL_KERNEL_LOGGERS)
    quieted = stderr_of("from paretorch.pipeline.cli.main import quiet_optional_kernels; "
                        f"quiet_optional_kernels(); {IMPORT}")
    assert "Failed to load" not in quieted
    assert "register_constant() on Enum subclasses" not in quieted  # torch's note on torchao's enums, at import
