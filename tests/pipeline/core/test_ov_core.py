"""Ctrl-C after OpenVINO ran still stops cleanly.

OpenVINO 2026.4's CPU plugin installs a signal stack (``sigaltstack``) on the thread that creates it and puts
the previous one back when it is destroyed. Two ``Core`` objects destroyed in the order they were made leave
the thread on the first one's freed stack, and the next signal handled there (Python's SIGINT handler runs
on the signal stack) ends the process with SIGSEGV instead of ``KeyboardInterrupt``. Every OpenVINO model
this project compiles goes through one process-wide ``Core`` (:func:`paretorch.pipeline.core.ov_core.shared_core`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

openvino = pytest.importorskip("openvino")

SCRIPT = textwrap.dedent('''
    import gc, os, signal, sys, time
    from pathlib import Path
    import openvino, torch
    from paretorch.pipeline.core.ov_session import open_ir
    from paretorch.pipeline.core.device import openvino_devices

    path = Path(sys.argv[1])
    openvino.save_model(openvino.convert_model(torch.nn.Linear(8, 4).eval(), example_input=torch.randn(2, 8)),
                        str(path))
    first = open_ir(path, torch.device("cpu"), threads=1)
    second = open_ir(path, torch.device("cpu"), threads=1)
    openvino_devices()
    del first; gc.collect()   # the first made, the first gone
    del second; gc.collect()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    except KeyboardInterrupt:
        print("interrupted cleanly")
''')


def test_ctrl_c_after_openvino_models_came_and_went_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "linear.xml")], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, f"exit {done.returncode} (-11 or 139: SIGSEGV)\n{done.stderr[-2000:]}"
    assert "interrupted cleanly" in done.stdout
