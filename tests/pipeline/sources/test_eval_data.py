"""--eval-data on every model form: a TorchScript classifier, an hf: embedding model, a Python spec, MiniLM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import optuna
import pytest
import torch
from torch import nn

from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.paths import RESULTS_ENV_VAR
from paretorch.pipeline.core.spec import ACCURACY
from paretorch.pipeline.core.task_metrics import PAIRS_METRIC
from paretorch.pipeline.search.objectives import ATTR_BASELINE
from paretorch.pipeline.sources import SourceOptions
from paretorch.pipeline.sources.resolve import resolve_spec

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def keep_results_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main(--results-dir ...)`` points the process at another folder: restore the session's after each test."""
    monkeypatch.setenv(RESULTS_ENV_VAR, os.environ[RESULTS_ENV_VAR])
QUICK = ["--trials", "2", "--no-tracking", "--latency-budget", "quick", "--runtimes", "eager", "--threads", "1"]


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


@pytest.fixture(scope="module")
def classifier_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval_data")
    torch.manual_seed(0)
    model = TinyClassifier().eval()
    inputs = torch.randn(64, 6)
    with torch.no_grad():
        labels = model(inputs).argmax(dim=1)
    labels[:16] = (labels[:16] + 1) % 4  # a quarter wrong: the unoptimized accuracy is 0.75
    paths = {"model": root / "classifier.pt", "data": root / "labelled.pt", "bad": root / "bad_labels.pt"}
    torch.jit.script(model).save(str(paths["model"]))
    torch.save({"inputs": inputs, "labels": labels}, paths["data"])
    torch.save({"inputs": inputs, "labels": labels + 10}, paths["bad"])
    return paths


def test_torchscript_classifier_is_scored_by_accuracy(classifier_files: dict[str, Path]) -> None:
    spec = resolve_spec(str(classifier_files["model"]), SourceOptions(eval_data=str(classifier_files["data"])))
    assert spec.metric is ACCURACY
    assert "top1_agreement" in [m.name for m in spec.extra_metrics]  # fidelity stays as an extra
    model = spec.build()
    assert compute_metric(model, spec.evaluation(), spec.metric, CPU) == pytest.approx(0.75)


def test_torchscript_classifier_optimized_with_eval_data(classifier_files: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["optimize", "--model", str(classifier_files["model"]), "--eval-data", str(classifier_files["data"]),
                 "--results-dir", str(tmp_path), "--device", "cpu", *QUICK])
    out = capsys.readouterr().out
    assert code == 0, out
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert study.user_attrs[ATTR_BASELINE]["metric_value"] == pytest.approx(0.75)
    assert "accuracy" in study.metric_names


def test_label_out_of_range_is_one_error_line(classifier_files: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["evaluate", "--model", str(classifier_files["model"]), "--eval-data", str(classifier_files["bad"])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: --eval-data")
    assert "out of range: the model has 4 classes" in err[0]


def test_text_data_for_a_tensor_model_says_what_to_pass(classifier_files: dict[str, Path], tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_text("text\tlabel\na\t0\nb\t1\n")
    with pytest.raises(Exception, match=r"holds text; a torchscript model takes tensors"):
        resolve_spec(str(classifier_files["model"]), SourceOptions(eval_data=str(table)))


# --------------------------------------------------------------------------- hf: embedding model


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BERT encoder with MiniLM's tokenizer, saved as a sentence-transformers directory."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from paretorch.experiments.models.minilm import model_dir

    directory = tmp_path_factory.mktemp("tiny_hf")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).eval().save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    return directory


PAIRS = [
    ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
    ("A woman is slicing an onion.", "A woman cuts an onion.", 4.2),
    ("A dog runs in the park.", "The stock market fell today.", 0.1),
    ("Children are playing football.", "Kids play soccer outside.", 3.9),
    ("The cat sleeps on the sofa.", "A cat is sleeping on a couch.", 4.6),
    ("It is raining in London.", "A chef prepares a meal.", 0.3),
    ("Two men are fighting.", "Two men are talking.", 1.8),
    ("A plane is taking off.", "An airplane departs.", 4.4),
    ("A boy reads a book.", "A girl writes a letter.", 1.2),
    ("The sun is shining.", "It is a sunny day.", 4.0),
    ("A man is cooking pasta.", "A man is riding a horse.", 0.9),
    ("The car is red.", "The automobile is red.", 4.7),
]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS))
    return path


def test_hf_embedding_model_is_scored_on_pairs(tiny_hf_dir: Path, pairs_file: Path) -> None:
    spec = resolve_spec(f"hf:{tiny_hf_dir}", SourceOptions(eval_data=str(pairs_file)))
    assert spec.metric.name == PAIRS_METRIC
    assert "neighbour_agreement" in [m.name for m in spec.extra_metrics]
    inputs, targets = spec.evaluation()[0]
    assert inputs[0].shape[1] <= 64  # padded to the longest text, not to 128
    assert targets.tolist() == list(range(len(targets)))


def test_pairs_rows_are_batched_by_length_and_scored_as_in_the_files_order(
        tiny_hf_dir: Path, pairs_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46.1 (the first trial within minutes): the distinct texts of labelled pairs are sorted by length within
    windows and every batch is cut to its longest, so no batch pays for the longest sentence of the set; the metric
    is the one of the file's order (the pairs name their texts), and the workload still times the file's order."""
    from paretorch.pipeline.core import task_spec
    from paretorch.pipeline.core.spec import load_model

    spec = resolve_spec(f"hf:{tiny_hf_dir}", SourceOptions(eval_data=str(pairs_file)))
    monkeypatch.setattr(task_spec, "LENGTH_WINDOW", 1)  # a window of one row: the file's order
    in_file_order = resolve_spec(f"hf:{tiny_hf_dir}", SourceOptions(eval_data=str(pairs_file)))
    texts = list(dict.fromkeys([a for a, _, _ in PAIRS] + [b for _, b, _ in PAIRS]))
    assert list(in_file_order.evaluation_texts) == texts
    assert sorted(spec.evaluation_texts) == sorted(texts) and list(spec.evaluation_texts) != texts
    assert spec.latency_texts is not None and list(spec.latency_texts()) == texts, "served in the file's order"
    mask = spec.padding_mask or 1
    lengths = [int(batch[mask].sum(dim=1).max()) for batch, _ in spec.evaluation()]
    assert [int(batch[mask].shape[1]) for batch, _ in spec.evaluation()] == lengths, "each batch cut to its longest"
    model = load_model(spec)
    sorted_metric = compute_metric(model, spec.evaluation(), spec.metric, CPU)
    assert sorted_metric == pytest.approx(compute_metric(model, in_file_order.evaluation(), in_file_order.metric,
                                                         CPU), abs=1e-4)


def test_windowed_length_order_keeps_each_window_its_own_rows() -> None:
    from paretorch.pipeline.core.task_spec import windowed_length_order

    lengths = torch.tensor([5, 1, 3, 3, 9, 2, 7])
    order = windowed_length_order(lengths, window=3)
    assert order.tolist() == [1, 2, 0, 5, 3, 4, 6]  # stable within a window, windows in place


def test_hf_latency_sample_is_the_eval_texts_at_their_own_lengths(tiny_hf_dir: Path, pairs_file: Path) -> None:
    """Without --inputs-file the --eval-data texts are the latency sample; each batch is cut to its longest
    text (a bucket for static shapes), with the outputs of full padding."""
    from paretorch.pipeline.core.padding import latency_inputs, pad_to
    from paretorch.pipeline.core.spec import load_model

    spec = resolve_spec(f"hf:{tiny_hf_dir}", SourceOptions(eval_data=str(pairs_file)))
    texts = list(dict.fromkeys([a for a, _, _ in PAIRS] + [b for _, b, _ in PAIRS]))
    inputs, lengths = latency_inputs(spec, 4, "eager")
    assert lengths is not None and inputs[0].shape == (4, lengths.length) and lengths.length < 20
    assert spec.encode_text is not None
    ids, mask = spec.encode_text(texts)
    encoded = {tuple(row[keep.bool()].tolist()) for row, keep in zip(ids, mask, strict=True)}
    assert all(tuple(row[keep.bool()].tolist()) in encoded for row, keep in zip(*inputs, strict=True))
    static, bucket = latency_inputs(spec, 4, "compile_cudagraphs")
    assert bucket is not None and static[0].shape[1] == 16
    model = load_model(spec)
    with torch.inference_mode():
        full = model(*pad_to(inputs, 128, spec.padding_mask or 1))
        assert torch.allclose(model(*inputs), full, atol=1e-5)


def test_hf_embedding_model_optimized_with_eval_data(tiny_hf_dir: Path, pairs_file: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["optimize", "--model", f"hf:{tiny_hf_dir}", "--eval-data", str(pairs_file), "--results-dir",
                 str(tmp_path), "--device", "cpu", "--disable", "prune,distill,amp", *QUICK])
    out = capsys.readouterr().out
    assert code == 0, out
    assert PAIRS_METRIC in out


# --------------------------------------------------------------------------- Python spec and MiniLM


def test_python_spec_takes_eval_data(digits_spec: object, tmp_path: Path) -> None:
    from paretorch.experiments.models import digits

    batches = digits.spec().evaluation()
    inputs = torch.cat([b[0][0] for b in batches])[:100]
    labels = torch.cat([b[1] for b in batches])[:100]
    torch.save({"inputs": inputs, "labels": labels}, tmp_path / "digits.pt")
    spec = resolve_spec("digits", SourceOptions(eval_data=str(tmp_path / "digits.pt")))
    assert spec.metric is ACCURACY and sum(len(t) for _, t in spec.evaluation()) == 100
    assert spec.source.startswith("digits --eval-data")  # its own study, not the digits study


def test_minilm_task_data_loads_offline() -> None:
    from paretorch.experiments.data import word_similarity
    from paretorch.experiments.models import minilm

    data = word_similarity.load()
    assert len(data) == 353 + 999 and data.first[0] == "love" and data.second[0] == "sex"
    assert min(data.scores) >= 0.0 and max(data.scores) <= 10.0 and len(set(data.scores)) > 100
    spec = minilm.spec()
    assert spec.metric.name == PAIRS_METRIC
    assert {"neighbour_agreement", "mean_cosine"} <= {m.name for m in spec.extra_metrics}
