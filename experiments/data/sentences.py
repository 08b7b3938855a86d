"""English prose sentences cut from running text (one rule for every shipped sentence set)."""

from __future__ import annotations

import re
from collections.abc import Iterable


def prose_sentences(paragraphs: Iterable[str], min_chars: int = 40, max_chars: int = 300,
                    seen: set[str] | None = None) -> list[str]:
    """The sentences of ``paragraphs`` that read as prose: ``min_chars``..``max_chars`` long, a capital
    first and ``.!?`` last, at least 6 words, at least 85 % letters and spaces; each once (case-blind,
    across calls sharing ``seen``), in order."""
    seen = set() if seen is None else seen
    sentences: list[str] = []
    for paragraph in paragraphs:
        text = re.sub(r"\s+", " ", paragraph).lstrip("*- ").strip()
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
            sentence = sentence.strip()
            if not (min_chars <= len(sentence) <= max_chars and sentence[0].isupper() and sentence[-1] in ".!?"):
                continue
            prose = sum(c.isalpha() or c == " " for c in sentence)
            if prose < 0.85 * len(sentence) or len(sentence.split()) < 6 or sentence.lower() in seen:
                continue
            seen.add(sentence.lower())
            sentences.append(sentence)
    return sentences
