"""The STS benchmark's raw TSV as the sentence-pair table that ``--eval-data`` and the bench's
``--held-out`` read.

The raw file has no header: genre, source file, year, id, score (0-5, the mean human grade),
sentence 1, sentence 2, and on some rows extra tab fields after sentence 2; quotes inside sentences are
text. The table written here has the header ``sentence1, sentence2, score``, one pair a row (read
with quoting off, like every ``.tsv``).

    python -m paretorch.experiments.data.sts_benchmark RAW.tsv OUT.tsv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

#: Columns of the raw file: score, sentence 1, sentence 2.
SCORE, SENTENCE1, SENTENCE2 = 4, 5, 6


def convert(raw: Path, out: Path) -> int:
    """Write the pairs of ``raw`` to ``out`` as a ``sentence1, sentence2, score`` table; returns the pair count."""
    rows = list(csv.reader(raw.read_text(encoding="utf-8").splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))
    bad = [i + 1 for i, row in enumerate(rows) if len(row) <= SENTENCE2]
    if bad:
        raise ValueError(f"{raw}: line(s) {bad[:5]} have fewer than {SENTENCE2 + 1} tab-separated fields: "
                         "not the STS benchmark's raw layout")
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["sentence1\tsentence2\tscore"] + [f"{r[SENTENCE1]}\t{r[SENTENCE2]}\t{r[SCORE]}" for r in rows]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.data.sts_benchmark",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        count = convert(args.raw, args.out)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(f"{count} pairs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
