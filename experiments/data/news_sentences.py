"""English news sentences, from the Lee corpus shipped in the ``gensim`` wheel.

``gensim/test/test_data/lee_background.cor``: 300 short Australian news articles (Lee,
Pincombe & Welsh 2005), one per line. Cut into prose sentences
(:func:`paretorch.experiments.data.sentences.prose_sentences`) and shuffled with a fixed seed.

They are unlabelled. MiniLM measures its fidelity floor on them
(:mod:`paretorch.pipeline.core.guards`): news is another domain than the pydoc sentences that
distillation trains on, so a student cannot match the teacher there just by fitting its
training domain. The human-labelled sentence pairs used in development are partly news too.
"""

from __future__ import annotations

import random
from pathlib import Path

from paretorch.experiments.data.sentences import prose_sentences
from paretorch.experiments.data.word_similarity import PACKAGE, data_dir
from paretorch.pipeline.core.errors import SpecError

FILE = "lee_background.cor"
#: How many sentences the floor is measured on (fixed seed): enough for a stable mean, cheap to embed.
COUNT = 512
SEED = 0


def load(directory: Path | None = None, count: int = COUNT) -> list[str]:
    """``count`` distinct news sentences in a fixed shuffled order."""
    path = (directory or data_dir()) / FILE
    try:
        articles = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SpecError(f"reading {path} failed ({exc}): reinstall {PACKAGE}") from exc
    sentences = prose_sentences(articles)
    if len(sentences) < count:
        raise SpecError(f"{path}: only {len(sentences)} news sentences, need {count}: reinstall {PACKAGE}")
    random.Random(SEED).shuffle(sentences)
    return sentences[:count]
