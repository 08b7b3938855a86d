"""The Lee document-similarity task: 50 English news paragraphs, every pair graded by people.

Lee, Pincombe & Welsh (2005), "An empirical evaluation of models of text document
similarity": 50 paragraphs from the Australian Broadcasting Corporation's news mail
service, each of the 1,225 pairs rated 1-5 by about 10 students (mean rating / 5 here).
The ``gensim`` wheel ships both files in ``gensim/test/test_data`` (``lee.cor``, one
paragraph a line, Latin-1; ``similarities0-1.txt``, the 50 x 50 upper-triangular matrix),
so ``make setup`` installs the data offline from a pinned package (gensim is LGPL-2.1;
the data carries no licence of its own and is published by its authors for research).

The score is the usual one for sentence-similarity tasks: Spearman x 100 between the
cosine similarity of the two texts' embeddings and the human rating.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import SpecError
from pipeline.core.task_data import PairsData

PACKAGE = "gensim"
DOCUMENTS = "lee.cor"
RATINGS = "similarities0-1.txt"
EXPECTED_DOCUMENTS = 50


def data_dir() -> Path:
    """gensim's bundled test-data folder (the package is imported for its location only)."""
    try:
        import gensim  # heavy import (about 1 s), only when the MiniLM task is scored
    except ImportError as exc:
        raise SpecError(f"the minilm task data needs the {PACKAGE} package: pip install '.[minilm]' ({exc})") from exc
    return Path(gensim.__file__).parent / "test" / "test_data"


def load(directory: Path | None = None) -> PairsData:
    """The 1,225 rated pairs of the 50 documents, as :class:`PairsData` (row order: i < j, row-major)."""
    directory = directory or data_dir()
    documents_path, ratings_path = directory / DOCUMENTS, directory / RATINGS
    try:
        documents = [line.strip() for line in documents_path.read_text(encoding="latin-1").splitlines()
                     if line.strip()]
        matrix = [[float(v) for v in line.split()] for line in ratings_path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise SpecError(f"reading the Lee similarity data in {directory} failed ({exc}): reinstall {PACKAGE}") from exc
    count = len(documents)
    if count != EXPECTED_DOCUMENTS or len(matrix) != count or any(len(row) != count for row in matrix):
        raise SpecError(f"the Lee similarity data in {directory} is not {EXPECTED_DOCUMENTS} documents with a "
                        f"{EXPECTED_DOCUMENTS}x{EXPECTED_DOCUMENTS} rating matrix: reinstall {PACKAGE}")
    pairs = [(i, j) for i in range(count) for j in range(i + 1, count)]
    return PairsData(
        source=f"{PACKAGE}:{DOCUMENTS}",
        first=tuple(documents[i] for i, _ in pairs),
        second=tuple(documents[j] for _, j in pairs),
        scores=tuple(matrix[i][j] for i, j in pairs),
    )
