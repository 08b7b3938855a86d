"""The one-liners bench (issue 46.6): each library's public call makes a model that runs and agrees with torch, the
search's best is compared with the fastest one-liner within the drop per round, and the section renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from paretorch.experiments.bench.one_liner_table import OneLinerResult, OneLinerRow, render
from paretorch.experiments.bench.one_liners import Side, best_against_one_liner, one_liners
from paretorch.experiments.bench.render import render_markdown

CPU = torch.device("cpu")


def _small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10)).eval()


def test_every_one_liner_is_made_from_the_library_call_and_runs_like_torch(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = _small_cnn()
    images = torch.randn(9, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    made = one_liners(model, (images[:4],), CPU, tmp_path)
    errors = [row for row in made if not isinstance(row, Side)]
    assert not errors, errors
    sides = {side.name: side for side in made if isinstance(side, Side)}
    assert {"ONNX Runtime fp32", "ONNX Runtime int8 dynamic", "OpenVINO fp32"} <= set(sides)
    with torch.inference_mode():
        expected = model(images)  # 9 rows, not the example's 4: run in chunks of it
    for name in ("ONNX Runtime fp32", "OpenVINO fp32"):
        assert torch.allclose(sides[name].fn(images), expected, atol=1e-4), name
    int8 = sides["ONNX Runtime int8 dynamic"].fn(images)
    assert int8.shape == expected.shape and not torch.equal(int8, expected)
    assert (int8 - expected).abs().max() < 0.1 * expected.abs().max()  # quantized, not broken
    assert (tmp_path / "model.int8.onnx").is_file() and (tmp_path / "model.xml").is_file()


def _side(name: str, kind: str) -> Side:
    def fn(x: Tensor) -> Tensor:
        return x

    return Side(name, kind, "call", fn, (torch.zeros(1),), 0.0)


def _row(name: str, kind: str, speedup: float, within: bool = True, tail: bool = True) -> OneLinerRow:
    return {"name": name, "kind": kind, "how": "call", "metric": 1.0, "drop": 0.0, "within_drop": within,
            "inputs": {"input_cosine_p01": 0.99 if tail else 0.5, "inputs_broken_share": 0.0 if tail else 0.4},
            "within_tail": tail, "speedup": speedup, "ci": [speedup, speedup], "ms": 1.0, "prepare_seconds": 0.0}


def test_the_best_is_compared_per_round_with_the_fastest_one_liner_within_the_drop() -> None:
    sides = [_side("torch", "baseline"), _side("ort", "one-liner"), _side("ov int8", "one-liner"),
             _side("best", "search")]
    # per round: the over-the-drop one-liner is the fastest, so the best is compared with ort
    samples = [[10.0, 10.0], [4.0, 5.0], [1.0, 1.0], [2.0, 2.5]]
    rows = [_row("torch", "baseline", 1.0), _row("ort", "one-liner", 2.2), _row("ov int8", "one-liner", 10.0, False),
            _row("best", "search", 4.4)]
    compared = best_against_one_liner(sides, rows, samples)
    assert compared is not None and compared["one_liner"] == "ort" and compared["ratio"] == pytest.approx(2.0)
    assert best_against_one_liner(sides, [rows[0], _row("ort", "one-liner", 2.2, False), rows[3]], samples) is None
    # a one-liner within the drop whose inputs break past the search's tail limit is not what the best is held to
    tailed = [rows[0], rows[1], _row("ov int8", "one-liner", 10.0, tail=False), rows[3]]
    compared = best_against_one_liner(sides, tailed, samples)
    assert compared is not None and compared["one_liner"] == "ort"


def test_the_section_renders_the_rows_a_failed_one_liner_and_the_verdict(tmp_path: Path) -> None:
    failed: OneLinerRow = {"name": "ONNX Runtime int8 dynamic", "kind": "one-liner", "how": "quantize_dynamic(a, b)",
                           "error": "InferenceError: shapes differ"}
    result: OneLinerResult = {
        "model": "efficientnet_lite0", "device": "cpu (AVX512, 1 threads)", "cpu": "x86", "batch": 1, "threads": 1,
        "affinity": [0], "load_before": "1.00", "load_after": "2.00", "date": "2026-12-02", "versions": {"torch": "2"},
        "metric_name": "top1_agreement", "max_drop": "1%", "allowed_drop": 0.01, "rounds": 20, "seconds": 60.0,
        "search": {"trials": 10, "search_seconds": 600.0, "best_trial": 3, "best_recipe": "fp32 @ onnxruntime",
                   "runtimes": ["eager"], "time_to_result": [[10.0, 2.5]]},
        "rows": [_row("torch fp32 eager (baseline)", "baseline", 1.0), failed, _row("ORT | fp32", "one-liner", 2.5),
                 _row("ORT int8", "one-liner", 5.0, tail=False), _row("search best (10 trials)", "search", 2.6)],
        "best_against_one_liner": {"one_liner": "ORT | fp32", "ratio": 1.02, "ci": [0.98, 1.05]},
        "note": "a shared machine",
    }
    (tmp_path / "one-liners-efficientnet_lite0-cpu.json").write_text(json.dumps(result))
    text = render_markdown(tmp_path)
    assert "### The search's best against the one-liners: efficientnet_lite0 on cpu (AVX512, 1 threads)" in text
    assert "| ONNX Runtime int8 dynamic | - | - | - | - | - | did not run: InferenceError: shapes differ |" in text
    assert "| ORT \\| fp32 | 1.0000 | p01 cos 0.990, 0.0 % broken | 2.50x [2.50, 2.50] |" in text
    assert "| ORT int8 | 1.0000 | p01 cos 0.500, 40.0 % broken (over the tail limit) | 5.00x" in text
    assert "10 trials in 10.0 min" in text
    assert "**level with the fastest one-liner within the drop and the per-input guard** (ORT | fp32)" in text
    assert "Note: a shared machine" in text


def test_a_non_bert_encoder_from_its_own_directory_is_searched_against_the_one_liners(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46.6 in small: what ``make bench`` runs on all-mpnet-base-v2 (``--model hf:DIR --eval-data PAIRS``), on
    a project-made two-layer MPNet (no small non-BERT encoder ships on PyPI) and 40 labelled pairs, two trials, the
    quick latency budget: the one-liner rows are made
    from the user's directory, the search's best is scored on the labels, and the file says when each trial ended."""
    from paretorch.experiments.bench import one_liners as bench
    from paretorch.pipeline.core.latency import LATENCY_BUDGETS
    from paretorch.pipeline.core.task_metrics import PAIRS_METRIC
    from paretorch.testing.text_encoders import save_text_encoder

    directory = save_text_encoder("mpnet", tmp_path / "mpnet")
    pairs = tmp_path / "pairs.tsv"
    words = ["cat", "dog", "car", "tree", "river", "city", "song", "book"]
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"a {words[i % 8]} near the {words[(i * 3) % 8]}\tthe {words[i % 8]} by a {words[(i * 5) % 8]}\t"
        f"{(i * 7) % 50 / 10:.1f}\n" for i in range(40)))
    monkeypatch.setattr(bench, "BENCH_LATENCY", LATENCY_BUDGETS["quick"])
    monkeypatch.setenv("PARETORCH_RESULTS_DIR", str(tmp_path / "runs"))
    out = tmp_path / "out"
    args = ["--model", f"hf:{directory}", "--eval-data", str(pairs), "--trials", "2", "--max-drop", "5",
            "--out", str(out)]  # an absolute drop: a random encoder scores near zero
    assert bench.main(args) == 0
    result: OneLinerResult = json.loads(next(out.glob("one-liners-*-cpu.json")).read_text())
    assert result["metric_name"] == PAIRS_METRIC
    assert "--eval-data" in result["command"] and f"hf:{directory}" in result["command"]
    rows = {row["name"]: row for row in result["rows"]}
    for name in ("ONNX Runtime fp32", "OpenVINO fp32"):
        assert "error" not in rows[name], rows[name]
        assert abs(rows[name]["drop"]) < 0.5, "the library's fp32 file scores as torch does on the labels"
    int8 = rows["ONNX Runtime int8 dynamic"]  # made, even where quant_pre_process fails on MPNet's export
    assert "error" not in int8 and int8["how"] in (bench.ORT_INT8_HOW, bench.ORT_INT8_UNPROCESSED_HOW), int8
    baseline = rows["torch fp32 eager (baseline)"]  # each row's inputs against it, by the search's own guard
    assert baseline["inputs"]["input_cosine_p01"] == pytest.approx(1.0) and baseline["within_tail"]
    assert rows["ONNX Runtime fp32"]["inputs"]["input_cosine_p01"] > 0.999
    assert int8["inputs"]["input_cosine_p01"] < baseline["inputs"]["input_cosine_p01"]
    assert "search best (2 trials)" in rows
    ended = result["search"]["trials_completed"]
    assert len(ended) >= 2 and all(seconds is not None and seconds > 0 for seconds in ended)
    section = render(result)
    assert "`python -m paretorch.experiments.bench.one_liners --model hf:" in section
    assert "trial 0 ended after" in section
