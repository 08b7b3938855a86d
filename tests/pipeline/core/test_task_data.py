"""Labelled evaluation data (--eval-data): the three formats, their errors, and the task metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.ranking import average_ranks, ndcg_at_k, recall_at_k, spearman
from paretorch.pipeline.core.task_data import (
    ClassificationData,
    PairsData,
    RetrievalData,
    load_task_data,
    resolve_labels,
)
from paretorch.pipeline.core.task_metrics import pairs_metric, top_k_accuracy

# --------------------------------------------------------------------------- rank statistics


def test_average_ranks_share_ties() -> None:
    assert average_ranks(torch.tensor([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_spearman_against_a_hand_computed_case() -> None:
    # ranks x = 1 2 3 4 5, ranks y = 2 1 4 3 5: d^2 = 1+1+1+1+0 = 4; rho = 1 - 6*4 / (5*24) = 0.8
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    y = torch.tensor([0.2, 0.1, 0.9, 0.5, 1.0])
    assert spearman(x, y).item() == pytest.approx(0.8)
    assert spearman(x, -x).item() == pytest.approx(-1.0)


def test_spearman_with_ties_matches_pearson_of_average_ranks() -> None:
    # x ranks 1.5 1.5 3 4; y ranks 1 2 3 4 -> Pearson of those
    rx, ry = [1.5, 1.5, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]
    mx, my = sum(rx) / 4, sum(ry) / 4
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    expected = cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert spearman(torch.tensor([1.0, 1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])).item() == pytest.approx(
        expected)


def test_ndcg_and_recall_against_hand_computed_cases() -> None:
    # One query, 4 documents; relevant: doc 1 (gain 2) and doc 3 (gain 1). Ranking by score: 3, 0, 1, 2.
    scores = torch.tensor([[0.5, 0.4, 0.1, 0.9]])
    relevance = torch.tensor([[0.0, 2.0, 0.0, 1.0]])
    dcg = 1 / math.log2(2) + 2 / math.log2(4)  # doc 3 at rank 1, doc 1 at rank 3
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(scores, relevance, k=10).item() == pytest.approx(dcg / ideal)
    assert recall_at_k(scores, relevance, k=1).item() == pytest.approx(0.5)
    assert recall_at_k(scores, relevance, k=3).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least one relevant"):
        ndcg_at_k(scores, torch.zeros_like(relevance))


def test_pairs_metric_reads_rows_in_order() -> None:
    # Rows 0..3; pairs (0,1), (0,2), (2,3): cosines 0.994, 0, 0.995 rank 2 1 3; scores 4, 0.5, 3 rank 3 1 2:
    # rho = 1 - 6 * (1 + 0 + 1) / (3 * 8) = 0.5
    outputs = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 1.0]])
    metric = pairs_metric([0, 0, 2], [1, 2, 3], [4.0, 0.5, 3.0], rows=4)
    assert metric.compute(outputs, torch.arange(4)).item() == pytest.approx(100.0 * 0.5)
    with pytest.raises(ValueError, match="rows in order"):
        metric.compute(outputs, torch.tensor([1, 0, 2, 3]))


def test_top_k_accuracy() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.9, 0.07, 0.03]])
    assert top_k_accuracy(2).compute(logits, torch.tensor([2, 2])).item() == pytest.approx(0.5)


# --------------------------------------------------------------------------- formats


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_pairs_table_in_each_format(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "p.tsv", 'sentence1\tsentence2\tscore\nA "quoted" cat.\tA cat.\t4.5\nDogs.\tRain.\t0.2\n')
    csv = _write(tmp_path / "p.csv", 'sentence1,sentence2,score\n"A cat, sitting.",A cat.,4.5\nDogs.,Rain.,0.2\n')
    jsonl = _write(tmp_path / "p.jsonl", "\n".join(json.dumps(r) for r in (
        {"sentence1": "A cat.", "sentence2": "A cat.", "score": 5},
        {"sentence1": "Dogs.", "sentence2": "Rain.", "score": 0.2})))
    for path in (tsv, csv, jsonl):
        data = load_task_data(str(path))
        assert isinstance(data, PairsData) and len(data) == 2 and data.scores[1] == pytest.approx(0.2)
    assert load_task_data(str(tsv)).first[0] == 'A "quoted" cat.'
    assert load_task_data(str(csv)).first[0] == "A cat, sitting."


def test_classification_table_and_tensor_file(tmp_path: Path) -> None:
    table = load_task_data(str(_write(tmp_path / "c.tsv", "text\tlabel\ngood\t1\nbad\tnegative\n")))
    assert isinstance(table, ClassificationData) and table.labels == (1, "negative")
    assert resolve_labels(table, 2, ("negative", "positive")).tolist() == [1, 0]
    torch.save({"inputs": torch.randn(4, 3), "labels": torch.tensor([0, 1, 2, 1])}, tmp_path / "c.pt")
    tensors = load_task_data(str(tmp_path / "c.pt"))
    assert isinstance(tensors, ClassificationData) and tensors.tensors is not None
    assert tensors.tensors[0].shape == (4, 3)


def _beir(root: Path, qrels: str, queries: tuple[str, ...] = ("q1", "q2")) -> Path:
    root.mkdir()
    _write(root / "corpus.jsonl", "\n".join(json.dumps({"_id": d, "title": "", "text": f"text of {d}"})
                                            for d in ("d1", "d2", "d3")))
    _write(root / "queries.jsonl", "\n".join(json.dumps({"_id": q, "text": f"query {q}"}) for q in queries))
    _write(root / "qrels.tsv", "query-id\tcorpus-id\tscore\n" + qrels)
    return root


def test_beir_directory(tmp_path: Path) -> None:
    data = load_task_data(str(_beir(tmp_path / "beir", "q1\td2\t1\nq2\td1\t2\nq2\td3\t0\n")))
    assert isinstance(data, RetrievalData)
    assert data.relevant == ({1: 1.0}, {0: 2.0})  # a zero score is judged not relevant


@pytest.mark.parametrize(("name", "text", "message"), [
    ("missing.tsv", "sentence1\tscore\nA\t1\nB\t2\n", r"columns score, sentence1 name no task"),
    ("nonnumeric.tsv", "sentence1\tsentence2\tscore\nA\tB\t1\nC\tD\thigh\n",
     r"missing.*|row 3: score 'high' is not a number"),
    ("empty.tsv", "sentence1\tsentence2\tscore\n", r"no data rows"),
    ("short.tsv", "sentence1\tsentence2\tscore\nA\tB\t1\nC\tD\n", r"row 3: 2 field\(s\), the header has 3"),
    ("blank.tsv", "text\tlabel\nA\t1\n \t0\n", r"row 3: 'text' is empty or missing"),
    ("same.tsv", "sentence1\tsentence2\tscore\nA\tB\t1\nC\tD\t1\n", r"every pair has the same score"),
    ("bad.jsonl", '{"text": "a", "label": 1}\nnot json\n', r"line 2: not JSON"),
    ("model.onnx", "x", r"unknown format '.onnx'"),
])
def test_malformed_tables_are_one_error_naming_the_row(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_task_data(str(_write(tmp_path / name, text)))


def test_label_out_of_range_names_the_row(tmp_path: Path) -> None:
    data = load_task_data(str(_write(tmp_path / "c.tsv", "text\tlabel\na\t0\n\nb\t7\n")))
    assert isinstance(data, ClassificationData)
    with pytest.raises(SpecError, match=r"row 4: label 7 is out of range: the model has 3 classes"):
        resolve_labels(data, 3)
    with pytest.raises(SpecError, match=r"label 'x' is not a class index"):
        resolve_labels(ClassificationData("f", ("x", 0), texts=("a", "b"), row_numbers=(2, 3)), 3)


def test_bad_retrieval_directories(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"query 'q2' has no relevant document"):
        load_task_data(str(_beir(tmp_path / "a", "q1\td1\t1\n")))
    with pytest.raises(SpecError, match=r"qrels.tsv, row 2: document 'd9' is not in corpus.jsonl"):
        load_task_data(str(_beir(tmp_path / "b", "q1\td9\t1\n")))
    (tmp_path / "c").mkdir()
    with pytest.raises(SpecError, match=r"missing: corpus.jsonl, queries.jsonl"):
        load_task_data(str(tmp_path / "c"))


def test_bad_tensor_files(tmp_path: Path) -> None:
    torch.save({"inputs": torch.randn(3, 2), "labels": torch.tensor([0.5, 1.0, 0.0])}, tmp_path / "float.pt")
    torch.save({"inputs": torch.randn(3, 2), "labels": torch.tensor([0, 1])}, tmp_path / "rows.pt")
    torch.save(torch.randn(3, 2), tmp_path / "bare.pt")
    for name, message in (("float.pt", "1-D integer tensor"), ("rows.pt", "one row per label"),
                          ("bare.pt", "expected a dict with 'inputs' and 'labels'")):
        with pytest.raises(SpecError, match=message):
            load_task_data(str(tmp_path / name))
