"""Labelled evaluation data from a file (``--eval-data``): the user's task, not fidelity.

Three tasks, told apart by the file's form and columns:

* **classification**, inputs and a label -> accuracy (top-1; top-5 as an extra where the
  model has more than 5 classes):
  - a text table with the columns ``text`` and ``label`` (``.tsv``, ``.csv`` or ``.jsonl``);
    a label is a class index ``0 .. classes-1`` (or, for a Hugging Face classifier, a name
    from its ``id2label``);
  - a ``.pt`` file, ``torch.save({"inputs": tensor_or_tuple, "labels": int_tensor})``
    (read with ``weights_only=True``: loading it runs no code), for models that take tensors;
* **pairs** with a graded score -> Spearman x 100 between the cosine similarity of the two
  outputs and the score (sentence-similarity style): a table with ``sentence1``,
  ``sentence2`` and ``score``;
* **retrieval** -> nDCG@10 (primary) and recall@10 / recall@100: a directory in the BEIR
  layout: ``corpus.jsonl`` (``{"_id", "text"}``, optional ``"title"``), ``queries.jsonl``
  (``{"_id", "text"}``) and ``qrels.tsv`` or ``qrels/test.tsv`` (header, then
  ``query-id  corpus-id  score``; score > 0 is relevant, its value the graded gain).

Tables have a header row. ``.tsv`` is read with quoting off (quotes inside sentences
are text); ``.csv`` with standard CSV quoting; ``.jsonl`` holds one JSON object a line.
Every problem is one :class:`SpecError` naming the file and the row (1-based, header
= row 1; for JSONL the line), and nothing is half-loaded.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.user_files import TENSOR_SUFFIXES, check_eval_data

#: Columns that name each text task (a table's header must hold one of these sets).
CLASSIFICATION_COLUMNS = ("text", "label")
PAIRS_COLUMNS = ("sentence1", "sentence2", "score")
BEIR_FILES = ("corpus.jsonl", "queries.jsonl")
QRELS_CANDIDATES = ("qrels.tsv", "qrels/test.tsv")
MIN_ROWS = 2


@dataclass(frozen=True)
class ClassificationData:
    """Inputs (texts or a tensor batch) and integer labels (or label names, mapped later)."""

    source: str
    labels: tuple[int | str, ...]
    texts: tuple[str, ...] | None = None
    tensors: Batch | None = None
    #: The file row of each label (text tables), for error messages.
    row_numbers: tuple[int, ...] = ()
    task: str = "classification"

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class PairsData:
    """Sentence pairs with a graded similarity score."""

    source: str
    first: tuple[str, ...]
    second: tuple[str, ...]
    scores: tuple[float, ...]
    task: str = "pairs"

    def __len__(self) -> int:
        return len(self.scores)

    def subset(self, rows: Sequence[int]) -> PairsData:
        """The pairs at ``rows`` (a held-out split, a search sample)."""
        return PairsData(self.source, tuple(self.first[i] for i in rows), tuple(self.second[i] for i in rows),
                         tuple(self.scores[i] for i in rows))


@dataclass(frozen=True)
class RetrievalData:
    """Queries, a corpus and graded relevance judgements (query index -> {document index: gain})."""

    source: str
    queries: tuple[str, ...]
    corpus: tuple[str, ...]
    relevant: tuple[dict[int, float], ...]
    task: str = "retrieval"

    def __len__(self) -> int:
        return len(self.queries)


TaskData = ClassificationData | PairsData | RetrievalData


def load_task_data(path_text: str) -> TaskData:
    """Read ``--eval-data``: a table (classification or pairs), a ``.pt`` file or a BEIR directory."""
    path = Path(path_text).expanduser()
    check_eval_data(path)  # a BEIR directory, or a file of a known format
    if path.is_dir():
        return _read_beir(path)
    if path.suffix.lower() in TENSOR_SUFFIXES:
        return _read_tensor_classification(path)
    rows = list(_read_table(path))
    if not rows:
        raise SpecError(f"--eval-data {path}: no data rows: give a header and at least {MIN_ROWS} rows")
    columns = set(rows[0][1])
    if set(PAIRS_COLUMNS) <= columns:
        data: TaskData = _pairs(path, rows)
    elif set(CLASSIFICATION_COLUMNS) <= columns:
        data = _classification(path, rows)
    else:
        raise SpecError(
            f"--eval-data {path}: columns {', '.join(sorted(columns)) or '(none)'} name no task: "
            f"use {', '.join(CLASSIFICATION_COLUMNS)} (classification) or {', '.join(PAIRS_COLUMNS)} (pairs)"
        )
    if len(data) < MIN_ROWS:
        raise SpecError(f"--eval-data {path}: {len(data)} row(s); give at least {MIN_ROWS}")
    return data


def task_texts(data: TaskData) -> list[str]:
    """Every input text of the data, once each, in file order ([] for tensor inputs)."""
    if isinstance(data, ClassificationData):
        texts: Sequence[str] = data.texts or ()
    elif isinstance(data, PairsData):
        texts = [*data.first, *data.second]
    else:
        texts = [*data.queries, *data.corpus]
    return list(dict.fromkeys(texts))


# --------------------------------------------------------------------------- tables


def _read_table(path: Path) -> Iterator[tuple[int, Mapping[str, object]]]:
    """(row number, record) for each data row; the header is row 1 (JSONL: the line number)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"--eval-data {path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    if path.suffix.lower() == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"--eval-data {path}, line {number}: not JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise SpecError(f"--eval-data {path}, line {number}: a {type(record).__name__}, not a JSON object")
            yield number, record
        return
    tsv = path.suffix.lower() == ".tsv"
    reader = csv.reader(text.splitlines(), delimiter="\t" if tsv else ",",
                        quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
    try:
        header = [name.strip() for name in next(reader)]
    except StopIteration:
        return
    for number, cells in enumerate(reader, start=2):
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) < len(header):
            missing = ", ".join(header[len(cells):])
            raise SpecError(f"--eval-data {path}, row {number}: {len(cells)} field(s), the header has "
                            f"{len(header)} (missing: {missing})")
        yield number, dict(zip(header, cells, strict=False))


def _text(path: Path, number: int, record: Mapping[str, object], column: str) -> str:
    value = record.get(column)
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"--eval-data {path}, row {number}: '{column}' is empty or missing")
    return value.strip()


def _pairs(path: Path, rows: list[tuple[int, Mapping[str, object]]]) -> PairsData:
    first, second, scores = [], [], []
    for number, record in rows:
        first.append(_text(path, number, record, "sentence1"))
        second.append(_text(path, number, record, "sentence2"))
        raw = record.get("score")
        try:
            score = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SpecError(f"--eval-data {path}, row {number}: score {raw!r} is not a number") from None
        if not math.isfinite(score):
            raise SpecError(f"--eval-data {path}, row {number}: score {raw!r} is not a finite number")
        scores.append(score)
    if len(set(scores)) < 2:
        raise SpecError(f"--eval-data {path}: every pair has the same score; a rank correlation needs scores "
                        "that differ")
    return PairsData(str(path), tuple(first), tuple(second), tuple(scores))


def _classification(path: Path, rows: list[tuple[int, Mapping[str, object]]]) -> ClassificationData:
    texts, labels = [], []
    for number, record in rows:
        texts.append(_text(path, number, record, "text"))
        labels.append(_label(path, number, record.get("label")))
    return ClassificationData(str(path), tuple(labels), texts=tuple(texts), row_numbers=tuple(n for n, _ in rows))


def _label(path: Path, number: int, raw: object) -> int | str:
    if isinstance(raw, bool) or raw is None or (isinstance(raw, str) and not raw.strip()):
        raise SpecError(f"--eval-data {path}, row {number}: 'label' is empty or missing")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    text = str(raw).strip()
    try:
        return int(text)
    except ValueError:
        return text  # a class name: mapped against the model's label names (or rejected) later


def _read_tensor_classification(path: Path) -> ClassificationData:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file: one line naming it
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"--eval-data {path}: cannot read it ({first}); save it with "
                        "torch.save({'inputs': tensor_or_tuple, 'labels': int_tensor}, path)") from exc
    if not isinstance(loaded, dict) or not {"inputs", "labels"} <= set(loaded):
        keys = f" with keys {', '.join(map(str, loaded))}" if isinstance(loaded, dict) else ""
        raise SpecError(f"--eval-data {path}: expected a dict with 'inputs' and 'labels', got "
                        f"{type(loaded).__name__}{keys}")
    inputs, labels = loaded["inputs"], loaded["labels"]
    tensors = (inputs,) if isinstance(inputs, Tensor) else inputs
    if not isinstance(tensors, tuple | list) or not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise SpecError(f"--eval-data {path}: 'inputs' must be a tensor or a tuple of tensors")
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.is_floating_point() or labels.is_complex():
        raise SpecError(f"--eval-data {path}: 'labels' must be a 1-D integer tensor (one class index a sample)")
    for t in tensors:
        if t.dim() == 0 or t.shape[0] != labels.shape[0]:
            raise SpecError(f"--eval-data {path}: an input of shape {tuple(t.shape)} does not have one row per "
                            f"label ({labels.shape[0]} labels)")
    if labels.shape[0] < MIN_ROWS:
        raise SpecError(f"--eval-data {path}: {labels.shape[0]} sample(s); give at least {MIN_ROWS}")
    return ClassificationData(str(path), tuple(int(v) for v in labels.tolist()),
                              tensors=tuple(t.detach().contiguous() for t in tensors))


def resolve_labels(data: ClassificationData, classes: int, names: Sequence[str] = ()) -> Tensor:
    """The labels as class indices, checked against the model's ``classes`` (and label ``names``)."""
    index = {name: i for i, name in enumerate(names)}
    resolved = []
    for row, label in enumerate(data.labels):
        where = (f"--eval-data {data.source}, row {data.row_numbers[row]}" if data.row_numbers
                 else f"--eval-data {data.source}, sample {row}")
        if isinstance(label, str):
            if label not in index:
                known = f"the model's labels are {', '.join(names)}" if names else "the model has no label names"
                raise SpecError(f"{where}: label '{label}' is not a class index ({known}); use 0..{classes - 1}")
            label = index[label]
        if not 0 <= label < classes:
            raise SpecError(f"{where}: label {label} is out of range: the model has {classes} classes "
                            f"(0..{classes - 1})")
        resolved.append(label)
    return torch.tensor(resolved, dtype=torch.int64)


# --------------------------------------------------------------------------- retrieval (BEIR)


def _read_beir(directory: Path) -> RetrievalData:
    missing = [name for name in BEIR_FILES if not (directory / name).is_file()]
    qrels_path = next((directory / name for name in QRELS_CANDIDATES if (directory / name).is_file()), None)
    if missing or qrels_path is None:
        absent = missing + ([] if qrels_path else [" or ".join(QRELS_CANDIDATES)])
        raise SpecError(f"--eval-data {directory}: a retrieval directory needs corpus.jsonl, queries.jsonl and "
                        f"qrels.tsv (BEIR layout); missing: {', '.join(absent)}")
    corpus_ids, corpus = _beir_records(directory / "corpus.jsonl", with_title=True)
    query_ids, queries = _beir_records(directory / "queries.jsonl", with_title=False)
    document_index = {doc_id: i for i, doc_id in enumerate(corpus_ids)}
    query_index = {query_id: i for i, query_id in enumerate(query_ids)}
    relevant: list[dict[int, float]] = [{} for _ in queries]
    rows = list(csv.reader(qrels_path.read_text(encoding="utf-8-sig").splitlines(), delimiter="\t",
                           quoting=csv.QUOTE_NONE))
    for number, cells in enumerate(rows, start=1):
        if number == 1 and cells and not _is_number(cells[-1]):
            continue  # the header
        if not any(c.strip() for c in cells):
            continue
        if len(cells) < 3:
            raise SpecError(f"--eval-data {qrels_path}, row {number}: expected query-id, corpus-id, score")
        query_id, doc_id, raw = cells[0].strip(), cells[1].strip(), cells[2].strip()
        if query_id not in query_index:
            raise SpecError(f"--eval-data {qrels_path}, row {number}: query '{query_id}' is not in queries.jsonl")
        if doc_id not in document_index:
            raise SpecError(f"--eval-data {qrels_path}, row {number}: document '{doc_id}' is not in corpus.jsonl")
        if not _is_number(raw):
            raise SpecError(f"--eval-data {qrels_path}, row {number}: score {raw!r} is not a number")
        if float(raw) > 0:
            relevant[query_index[query_id]][document_index[doc_id]] = float(raw)
    for i, judged in enumerate(relevant):
        if not judged:
            raise SpecError(f"--eval-data {directory / 'queries.jsonl'}: query '{query_ids[i]}' has no relevant "
                            f"document in {qrels_path.name}: judge at least one, or remove the query")
    if len(corpus) < MIN_ROWS:
        raise SpecError(f"--eval-data {directory}: the corpus has {len(corpus)} document(s); give at least {MIN_ROWS}")
    return RetrievalData(str(directory), tuple(queries), tuple(corpus), tuple(relevant))


def _beir_records(path: Path, with_title: bool) -> tuple[list[str], list[str]]:
    ids, texts, seen = [], [], set()
    for number, record in _read_table(path):
        record_id = str(record.get("_id", "")).strip()
        if not record_id:
            raise SpecError(f"--eval-data {path}, line {number}: '_id' is empty or missing")
        if record_id in seen:
            raise SpecError(f"--eval-data {path}, line {number}: '_id' {record_id!r} appears twice")
        seen.add(record_id)
        text = _text(path, number, record, "text")
        title = str(record.get("title") or "").strip() if with_title else ""
        ids.append(record_id)
        texts.append(f"{title} {text}" if title else text)
    if not ids:
        raise SpecError(f"--eval-data {path}: no records")
    return ids, texts


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
