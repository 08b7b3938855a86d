"""The STS benchmark's raw TSV becomes the pairs table ``--eval-data`` / ``--held-out`` read."""

from __future__ import annotations

from pathlib import Path

import pytest

from paretorch.experiments.data.sts_benchmark import convert, main
from paretorch.pipeline.core.task_data import PairsData, load_task_data

SHARED_STS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sentence-similarity-dev" / "pairs.tsv"


def test_raw_rows_become_pairs_with_quotes_and_extra_fields_kept_apart(tmp_path: Path) -> None:
    raw = tmp_path / "raw.tsv"
    raw.write_text('main-news\tMSRpar\t2012test\t0001\t3.800\tHe said "no".\tHe refused.\textra\tfields\n'
                   "main-captions\tMSRvid\t2012test\t0002\t0.500\tA cat sleeps.\tA man runs.\n", encoding="utf-8")
    assert convert(raw, tmp_path / "pairs.tsv") == 2
    data = load_task_data(str(tmp_path / "pairs.tsv"))
    assert isinstance(data, PairsData)
    assert list(data.first) == ['He said "no".', "A cat sleeps."]
    assert list(data.second) == ["He refused.", "A man runs."]
    assert list(data.scores) == [3.8, 0.5]


def test_a_file_of_another_layout_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "raw.tsv"
    raw.write_text("sentence1\tsentence2\tscore\nA\tB\t1.0\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        main([str(raw), str(tmp_path / "out.tsv")])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not the STS benchmark's raw layout" in err[0]


@pytest.mark.skipif(not SHARED_STS.is_file(), reason=f"no {SHARED_STS} beside this checkout")
def test_the_shared_dev_split_reads_as_1500_pairs(tmp_path: Path) -> None:
    assert convert(SHARED_STS, tmp_path / "sts-dev.tsv") == 1500
    assert len(load_task_data(str(tmp_path / "sts-dev.tsv"))) == 1500
