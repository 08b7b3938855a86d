"""MiniLM's unlabelled English sentences, fixed: a shipped text file, one sentence a line.

The sentences were cut once from Python 3.11.7's bundled documentation (``pydoc_data.topics``):
prose paragraphs only (code, grammar and doctest lines skipped), each cut with
:func:`paretorch.experiments.data.sentences.prose_sentences` (40-300 characters), in the sorted order of the
topics. Reading them from the interpreter at run time made the latency sample depend on the Python
version (256 x 68 tokens on 3.11, 256 x 91 on 3.12); the shipped file does not. The MiniLM spec
(:mod:`paretorch.experiments.models.minilm`) deduplicates and splits them.

Regenerate (only to change the sample on purpose; every recorded MiniLM figure moves with it):

    python -m paretorch.experiments.data.minilm_sentences --write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from paretorch.experiments.data.sentences import prose_sentences
from paretorch.pipeline.core.errors import SpecError

FILE = Path(__file__).resolve().parent / "minilm_sentences.txt"
MIN_CHARS, MAX_CHARS = 40, 300


def generate(min_chars: int = MIN_CHARS, max_chars: int = MAX_CHARS) -> list[str]:
    """Prose sentences from this interpreter's ``pydoc_data.topics``, in a fixed order (the file's source)."""
    from pydoc_data.topics import topics

    seen: set[str] = set()
    sentences: list[str] = []
    for key in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[key]):
            lines = [line.strip() for line in paragraph.splitlines()]
            if any(line.startswith((">>>", "...")) or "::=" in line for line in lines):
                continue
            sentences += prose_sentences([" ".join(lines)], min_chars, max_chars, seen)
    return sentences


def load(path: Path = FILE) -> list[str]:
    """The shipped sentences, in their fixed order."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"reading {path} failed ({exc}): reinstall paretorch (the file ships in the package)") from exc
    sentences = text.splitlines()
    if not sentences or any(not s.strip() for s in sentences):
        raise SpecError(f"{path} is empty or holds blank lines: regenerate it with "
                        "python -m paretorch.experiments.data.minilm_sentences --write")
    return sentences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.data.minilm_sentences",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {FILE.name} from this interpreter's pydoc")
    args = parser.parse_args(argv)
    sentences = generate()
    if not args.write:
        same = FILE.is_file() and load() == sentences
        print(f"{len(sentences)} sentences from Python {sys.version.split()[0]}'s pydoc; "
              + ("the same as" if same else "NOT the same as") + f" {FILE}")
        return 0
    FILE.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    print(f"{len(sentences)} sentences -> {FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
