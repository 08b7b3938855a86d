"""Use-based embedding fidelity: pairwise-similarity rank correlation and top-10 neighbour overlap,
the 'fidelity is conservative' note, and the scoring of experiments/bench/fidelity_check.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from rich.console import Console

from paretorch.experiments.bench.fidelity_check import human_score, read_pairs, render, tracking
from paretorch.pipeline.core.fidelity import (
    MAX_PAIRS,
    PAIRWISE_RANK_CORRELATION,
    fidelity_metrics,
    fidelity_note,
    fidelity_spec,
    neighbour_overlap,
    neighbour_overlap_at_10,
    pair_indices,
    pairwise_rank_correlation,
)
from paretorch.pipeline.core.ranking import spearman
from paretorch.pipeline.core.spec import ACCURACY
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.loop import FIDELITY_NOTE_TAG


def on_circle(*degrees: float) -> torch.Tensor:
    """Unit vectors at these angles: the cosine of two of them orders like their angular distance."""
    radians = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([radians.cos(), radians.sin()], dim=1).float()


def test_identical_outputs_score_one() -> None:
    embeddings = torch.randn(40, 16, generator=torch.Generator().manual_seed(0))
    assert pairwise_rank_correlation(embeddings.clone(), embeddings).item() == pytest.approx(1.0, abs=1e-6)
    assert neighbour_overlap_at_10(embeddings.clone(), embeddings).item() == 1.0


def test_a_rotation_or_rescaling_keeps_every_similarity_and_neighbour() -> None:
    embeddings = torch.randn(40, 16, generator=torch.Generator().manual_seed(1))
    moved = embeddings[:, torch.randperm(16, generator=torch.Generator().manual_seed(2))] * 3.0  # permuted axes
    assert pairwise_rank_correlation(moved, embeddings).item() == pytest.approx(1.0, abs=1e-6)
    assert neighbour_overlap_at_10(moved, embeddings).item() == 1.0


def test_pairwise_rank_correlation_hand_computed() -> None:
    # Targets at 0, 10, 30 degrees: pair (0,1) 10 apart, (0,2) 30, (1,2) 20 -> similarity ranks 3, 1, 2.
    # Outputs at 0, 25, 30: (0,1) 25, (0,2) 30, (1,2) 5 -> ranks 2, 1, 3. rho = 1 - 6 * 2 / (3 * 8) = 0.5.
    value = pairwise_rank_correlation(on_circle(0, 25, 30), on_circle(0, 10, 30))
    assert value.dim() == 0
    assert value.item() == pytest.approx(0.5, abs=1e-6)


def test_neighbour_overlap_hand_computed_one_neighbour_changes() -> None:
    targets = on_circle(0, 10, 30, 100, 200)
    # 2 nearest by angle: 0 -> {10, 30}, 10 -> {0, 30}, 30 -> {10, 0}, 100 -> {30, 10}, 200 -> {100, 0}.
    # Sample 3 moves from 100 to 250: its neighbours become {200, 0} (none shared); the others keep theirs.
    outputs = on_circle(0, 10, 30, 250, 200)
    assert neighbour_overlap(outputs, targets, k=2).item() == pytest.approx(4 / 5)
    # Order inside the top k does not count: with k = N - 1 every other sample is a neighbour.
    assert neighbour_overlap(outputs, targets, k=4).item() == 1.0


def test_neighbour_overlap_at_10_cuts_k_to_the_others() -> None:
    targets = on_circle(*range(0, 120, 10))  # 12 samples: k = 10 leaves out each one's farthest
    assert neighbour_overlap_at_10(on_circle(*range(0, 180, 15)), targets).item() == pytest.approx(1.0)
    small = on_circle(0, 10, 30)  # 3 samples: k = 2, every other one
    assert neighbour_overlap_at_10(on_circle(0, 90, 180), small).item() == 1.0
    assert math.isnan(neighbour_overlap_at_10(small[:1], small[:1]).item())  # undefined, not an error
    assert math.isnan(pairwise_rank_correlation(small[:2], small[:2]).item())  # one pair: nothing to rank


def test_pair_sample_is_fixed_and_skips_self_pairs() -> None:
    rows, cols = pair_indices(1000, max_pairs=5000)
    again_rows, again_cols = pair_indices(1000, max_pairs=5000)
    assert torch.equal(rows, again_rows) and torch.equal(cols, again_cols)
    assert rows.shape == (5000,) and not bool((rows == cols).any())
    assert int(rows.min()) >= 0 and int(max(rows.max(), cols.max())) < 1000
    every_row, every_col = pair_indices(5, max_pairs=5000)  # 10 pairs: the whole upper triangle
    assert every_row.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3]
    assert every_col.tolist() == [1, 2, 3, 4, 2, 3, 4, 3, 4, 4]


def test_subsampled_correlation_is_deterministic_and_close_to_the_exact_one() -> None:
    n = 700  # 244,650 pairs > MAX_PAIRS: sampled
    assert n * (n - 1) // 2 > MAX_PAIRS
    generator = torch.Generator().manual_seed(3)
    targets = torch.randn(n, 8, generator=generator)
    outputs = targets + 0.5 * torch.randn(n, 8, generator=generator)
    first = pairwise_rank_correlation(outputs, targets).item()
    assert pairwise_rank_correlation(outputs.clone(), targets.clone()).item() == first
    unit_out = torch.nn.functional.normalize(outputs, dim=1)
    unit_ref = torch.nn.functional.normalize(targets, dim=1)
    upper = torch.triu_indices(n, n, offset=1)
    exact = spearman((unit_out @ unit_out.T)[upper[0], upper[1]], (unit_ref @ unit_ref.T)[upper[0], upper[1]])
    assert first == pytest.approx(float(exact), abs=0.01)
    assert 0.3 < first < 0.99


def test_embedding_metrics_keep_mean_cosine_primary_and_report_both_use_metrics() -> None:
    names = [metric.name for metric in fidelity_metrics("embedding")]
    assert names[0] == "mean_cosine"  # chosen by experiments/bench/fidelity_check.py (fidelity.py docstring)
    assert {"pairwise_rank_correlation", "neighbour_overlap_at_10"} <= set(names[1:])


def test_fidelity_note_names_the_metric_and_eval_data() -> None:
    note = fidelity_note(PAIRWISE_RANK_CORRELATION)
    assert note is not None
    assert note.startswith("metric: pairwise_rank_correlation = fidelity to the unoptimized model")
    assert "conservative" in note and "--eval-data FILE" in note
    assert fidelity_note(ACCURACY) is None


def test_check_script_scores_a_tiny_pairs_file(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    rows = [  # genre, file, year, id, score, sentence 1, sentence 2 (+ an extra field; quotes stay text)
        ("a", "f", "2012", "0001", "5.0", "east", "east again"),
        ("a", "f", "2012", "0002", "3.5", "east", 'north "east"', "extra"),
        ("a", "f", "2012", "0003", "1.0", "east", "west"),
        ("a", "f", "2012", "0004", "0.0", "north", "south"),
    ]
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    pairs = read_pairs(path)
    assert pairs.sentences == ["east", "east again", 'north "east"', "west", "north", "south"]
    assert pairs.first.tolist() == [0, 0, 0, 4] and pairs.second.tolist() == [1, 2, 3, 5]
    assert pairs.scores.tolist() == [5.0, 3.5, 1.0, 0.0]
    # Angles whose pair cosines fall as the human scores do: Spearman 1 -> 100; reversed -> -100.
    agreeing = on_circle(0, 5, 40, 120, 0, 180)
    assert human_score(agreeing, pairs) == pytest.approx(100.0)
    assert human_score(on_circle(0, 180, 120, 40, 0, 5), pairs) == pytest.approx(-100.0)


def test_check_script_tracking_and_table() -> None:
    def row(name: str, human: float, a: float, b: float) -> dict[str, object]:
        return {"variant": name, "human": human, "fidelity": {"a": a, "b": b}}

    rows = [row("fp32", 80.0, 1.0, 1.0), row("q", 79.5, 0.99, 0.80), row("p", 70.0, 0.90, 0.85),
            row("d", 79.9, 0.95, 0.82)]
    stats = tracking(rows, ["a", "b"])
    assert stats["a"]["spearman"] == pytest.approx(0.5)  # human ranks 2, 1, 3 vs a's 3, 1, 2
    assert stats["a"]["lowest_as_good"] == 0.95 and stats["a"]["highest_worse"] == 0.90
    assert stats["a"]["separates"] is True
    assert stats["b"]["separates"] is False  # the worse variant scores highest on b
    table = render({"model": "m", "device": "cpu", "pairs": 4, "sentences": 6, "rows": rows, "tracking": stats})
    assert "| q | 79.50 * | - | 0.9900 | 0.8000 |" in table and "| p | 70.00 | - | 0.9000 | 0.8500 |" in table
    rows[1]["spec_metric"] = 44.5  # the spec's own metric (MiniLM: word similarity), when the check measured it
    table = render({"model": "m", "device": "cpu", "pairs": 4, "sentences": 6, "rows": rows, "tracking": stats})
    assert "| q | 79.50 * | 44.50 | 0.9900 | 0.8000 |" in table


class _Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.linear(x), dim=1)


def test_optimize_says_fidelity_is_conservative_on_the_console_and_the_parent_run(tmp_path: Path) -> None:
    data = torch.randn(96, 8, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    model = _Embedder().eval()
    spec = fidelity_spec("embedder", lambda: model, lambda b: (data[:b],), lambda: [(data[:16],)],
                         lambda: [(data[16:56],), (data[56:],)], latency_batch_sizes=(4,))
    config = SearchConfig.load(None, latency_budget="quick", exports="none", runtimes=("eager",), seeds=())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    search = Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'optuna.db'}",
                    tracking_uri=uri)
    out = tmp_path / "console.txt"
    with out.open("w") as stream:
        outcome = run_search(search, 1, console=Console(file=stream, width=400))
    note = fidelity_note(spec.metric)
    assert note is not None and note in out.read_text()
    assert outcome.parent_run_id is not None
    parent = MlflowClient(tracking_uri=uri).get_run(outcome.parent_run_id)
    assert parent.data.tags[FIDELITY_NOTE_TAG] == note
