"""The peers' own virtual environments, created once from exact pins.

sentence-transformers' backends cannot share one environment with paretorch or with each other
(``sentence-transformers[onnx,openvino]`` 6.2.0 does not resolve; ``[onnx]`` needs transformers < 4.58;
``[openvino]`` pulls a CUDA torch through torchvision unless pinned). Each family therefore has a
requirement file of exact versions in ``experiments/bench/peer_requirements/<family>.txt`` (resolved with
pip on Python 3.11, x86-64 Linux; ``torch==2.13.0+cpu`` first, found the way ``make setup`` finds it:
pip's own configuration, e.g. ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu``), and
the bench builds ``runs/bench/peer-envs/<family>/`` from it the first time (``--no-deps``: the file is the
whole environment; a few minutes each, 1-2 GB),
and again only when the file changes (a stamp in the environment holds the file's hash).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

REQUIREMENTS_DIR = Path(__file__).resolve().parent / "peer_requirements"
ENVS_DIR = Path(__file__).resolve().parents[2] / "runs" / "bench" / "peer-envs"
FAMILIES = ("onnx", "openvino")
STAMP = ".paretorch-requirements"
#: ``name==version`` (optionally with extras and a local label like ``+cpu``), nothing else.
EXACT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==[0-9][A-Za-z0-9.!+_-]*$")


class PeerEnvError(RuntimeError):
    """A peer environment could not be created: the message says why (shown in the peer's row)."""


def requirements_file(family: str) -> Path:
    """The requirement file of ``family`` (``onnx`` or ``openvino``)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown peer family {family!r}: one of {', '.join(FAMILIES)}")
    return REQUIREMENTS_DIR / f"{family}.txt"


def requirements(path: Path) -> list[str]:
    """The requirement lines of ``path`` (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def loose(lines: list[str]) -> list[str]:
    """The lines that are not one exact ``name==version`` pin."""
    return [line for line in lines if not EXACT.match(line)]


def python_of(env: Path) -> Path:
    """The interpreter of the virtual environment ``env``."""
    return env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise PeerEnvError(f"{what} failed (exit {done.returncode}): {tail}")


def ensure(family: str, envs_dir: Path = ENVS_DIR) -> Path:
    """The Python of ``family``'s environment, created (or re-created) from its pins where needed."""
    path = requirements_file(family)
    lines = requirements(path)
    if not lines or loose(lines):
        raise PeerEnvError(f"{path} has requirements that are not exact pins: {loose(lines)[:3]}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    env = envs_dir / family
    stamp = env / STAMP
    python = python_of(env)
    if python.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return python
    print(f"creating the {family} peer environment in {env} from {path} (once)", flush=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", "--clear", str(env)], f"python -m venv {env}")
    torch_pins = [line for line in lines if line.startswith("torch==")]
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if torch_pins:  # first and alone, as make setup does: nothing else may pick a CUDA build
        _run([*pip, *torch_pins], f"pip install {torch_pins[0]} into {env}")
    _run([*pip, "--no-deps", "-r", str(path)], f"pip install --no-deps -r {path} into {env}")
    stamp.write_text(digest + "\n")
    return python
