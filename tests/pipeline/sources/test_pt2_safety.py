"""A crafted .pt2 whose pickled weight would create a file on load: refused before anything is unpickled."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.sources.exported import load_exported
from paretorch.pipeline.sources.pt2_safety import code_entries

REPO = Path(__file__).resolve().parents[3]


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Payload:
    """Unpickling this creates ``marker``: what a malicious archive would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def export_tiny(path: Path) -> Path:
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(Tiny().eval(), (torch.randn(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


def make_malicious(clean: Path, target: Path, marker: Path) -> Path:
    """``clean`` with its first weight marked ``use_pickle`` and replaced by a pickle that writes ``marker``."""
    with zipfile.ZipFile(clean) as source:
        entries = {name: source.read(name) for name in source.namelist()}
    config_name = next(n for n in entries if n.endswith("data/weights/model_weights_config.json"))
    config = json.loads(entries[config_name])
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    entries[config_name] = json.dumps(config).encode()
    weight_name = config_name.rsplit("/", 1)[0] + "/" + first["path_name"]
    pickled = target.with_suffix(".payload")
    torch.save(Payload(marker), pickled)
    entries[weight_name] = pickled.read_bytes()
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as out:
        for name, data in entries.items():
            out.writestr(name, data)
    return target


@pytest.fixture()
def archives(tmp_path: Path) -> tuple[Path, Path, Path]:
    clean = export_tiny(tmp_path / "clean.pt2")
    marker = tmp_path / "code-ran"
    evil = make_malicious(clean, tmp_path / "evil.pt2", marker)
    return clean, evil, marker


def test_the_crafted_archive_really_runs_code_in_torch(archives: tuple[Path, Path, Path]) -> None:
    _clean, evil, marker = archives
    with contextlib.suppress(Exception):  # the payload is not a tensor: loading fails after the code ran
        torch.export.load(str(evil))
    assert marker.read_text() == "ran"


def test_clean_archive_loads_and_has_no_code_entries(archives: tuple[Path, Path, Path]) -> None:
    clean, _evil, _marker = archives
    assert code_entries(clean) == []
    assert load_exported(clean)(torch.randn(3, 4)).shape == (3, 2)


def test_malicious_archive_is_refused_before_unpickling(archives: tuple[Path, Path, Path]) -> None:
    _clean, evil, marker = archives
    assert code_entries(evil) == ["data/weights/model_weights_config.json: linear.weight (pickled)"]
    with pytest.raises(SpecError, match=r"asks to unpickle .*--trust-pickle"):
        load_exported(evil)
    assert not marker.exists()


def test_cli_prints_one_line_and_runs_nothing(archives: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _clean, evil, marker = archives
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "paretorch", "evaluate", "--model", str(evil), "--input-shape",
                           "2x4", "--results-dir", str(tmp_path / "results")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--trust-pickle" in lines[0], done.stderr
    assert not marker.exists()
