"""paretorch recipe rows in the peers' table: a recipe file replayed and timed by the peers' protocol."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paretorch.experiments.bench import peers, recipe_rows
from paretorch.experiments.models import minilm


def test_token_batches_pad_each_batch_to_its_own_longest_row() -> None:
    sentences = ["a short one.", "a much longer sentence with quite a few more words in it than the first.",
                 "tiny", "another line"]
    batches = recipe_rows.token_batches(sentences, batch=2, repeat=3)
    assert len(batches) == 6  # 2 batches, 3 times over
    first, second = batches[0], batches[1]
    assert int(first[1][:, -1].sum()) >= 1 and int(second[1][:, -1].sum()) >= 1  # no all-padding column
    assert first[0].shape[1] > second[0].shape[1]
    assert batches[2][0].equal(first[0])


def test_a_recipe_file_gives_one_row_per_sentence_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unoptimized model as a recipe (eager, no stage) against itself: a row per set, named by its short
    recipe, timed on each batch at its own length, with the task metric of its own outputs."""
    chunks: set[tuple[int, ...]] = set()

    def task_metric(fn: object, spec: object, device: object, runtime: str, batch_sizes: tuple[int, ...]) -> float:
        chunks.add(batch_sizes)
        return 42.0

    monkeypatch.setattr(recipe_rows, "task_metric", task_metric)
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"format": "paretorch-recipe/1", "model": "minilm", "runtime": "eager",
                                "stages": []}))
    sentences = minilm.sentences("evaluation")[:8]
    sets = {"latency sample": {"sentences": sentences[:4], "repeat": 2},
            "dev sentences": {"sentences": sentences[4:], "repeat": 1}}
    rows = recipe_rows.recipe_rows([path], sets, {"batch": 2, "rounds": 3, "warmup": 1}, held_out=None)
    assert [row["inputs"] for row in rows] == list(sets)
    for row in rows:
        assert row["kind"] == "paretorch" and row["name"] == "paretorch: baseline | eager"
        assert row["rounds"] == 3 and row["speedup"] > 0 and row["ci"][0] <= row["speedup"] <= row["ci"][1]
        assert row["batches"] == 2 and row["timed_widths"] == sorted(set(row["longest"]))
        assert row["metric"] == row["baseline_metric"] == 42.0 and row["held_out"] is None
    assert "paretorch: baseline | eager" in peers.describe_row(rows[0])
    assert chunks == {(2,)}, "scored (a compiled runtime) in chunks of the rows' batch"


def test_a_missing_recipe_file_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        peers.main(["--families", "--recipe", "/nonexistent/recipe.json"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --recipe /nonexistent/recipe.json does not exist")
