"""Human word-similarity ratings: WordSim-353 and SimLex-999, as shipped in the ``gensim`` wheel.

* WordSim-353 (Finkelstein et al. 2002): 353 English word pairs, each rated 0-10 for
  relatedness by 13-16 people;
* SimLex-999 (Hill, Reichart & Korhonen 2015): 999 English word pairs rated 0-10 for
  similarity (not mere relatedness) by about 50 people each.

``gensim`` ships both in ``gensim/test/test_data`` (``wordsim353.tsv``, ``simlex999.txt``:
``#`` comment lines, then ``word1<TAB>word2<TAB>rating``), so ``make setup`` installs them
offline from a pinned package. gensim is LGPL-2.1; both data sets are published by their
authors for research, with no licence file in the wheel.

The two sets share one 0-10 scale and are pooled: 1,352 pairs, scored as sentence-similarity
tasks are (Spearman x 100 between the cosine similarity of the two embeddings and the rating).
Measured with this project's stages on MiniLM (CPU), it moves with a human-labelled
*sentence* task (the STS benchmark's dev split) where the Lee document-similarity set, also in
the gensim wheel, does not: structured pruning 0.3 lowers STS from 86.7 to 81.1 and this score
from 44.3 to 39.6, while it *raises* the Lee score from 50.8 to 58.5.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.task_data import PairsData

PACKAGE = "gensim"
FILES = ("wordsim353.tsv", "simlex999.txt")
EXPECTED_PAIRS = 353 + 999
#: Override of the data folder (a copy of the two files, on a machine without gensim).
DATA_DIR_ENV_VAR = "PARETORCH_WORD_SIMILARITY_DIR"


def data_dir() -> Path:
    """gensim's bundled test-data folder (found without importing gensim), or ``$PARETORCH_WORD_SIMILARITY_DIR``."""
    override = os.environ.get(DATA_DIR_ENV_VAR)
    if override:
        return Path(override).expanduser()
    found = importlib.util.find_spec(PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise SpecError(f"the minilm task data needs the {PACKAGE} package: pip install '.[minilm]'")
    return Path(next(iter(found.submodule_search_locations))) / "test" / "test_data"


def load(directory: Path | None = None) -> PairsData:
    """The 1,352 rated word pairs (WordSim-353, then SimLex-999) as :class:`PairsData`."""
    directory = directory or data_dir()
    first: list[str] = []
    second: list[str] = []
    scores: list[float] = []
    for name in FILES:
        path = directory / name
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SpecError(f"reading {path} failed ({exc}): reinstall {PACKAGE}") from exc
        for number, line in enumerate(lines, start=1):
            if not line.strip() or line.startswith("#"):
                continue
            cells = line.split("\t")
            try:
                first.append(cells[0].strip())
                second.append(cells[1].strip())
                scores.append(float(cells[2]))
            except (IndexError, ValueError) as exc:
                raise SpecError(f"{path}, line {number}: not word1<TAB>word2<TAB>rating: reinstall {PACKAGE}") from exc
    if len(scores) != EXPECTED_PAIRS:
        raise SpecError(f"{directory}: {len(scores)} rated pairs in {', '.join(FILES)}, expected {EXPECTED_PAIRS}: "
                        f"reinstall {PACKAGE}")
    return PairsData(f"{PACKAGE}:{'+'.join(FILES)}", tuple(first), tuple(second), tuple(scores))
