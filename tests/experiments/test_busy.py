"""The busy-machine check's verdict: same front, busy speed-ups inside the quiet intervals."""

from __future__ import annotations

from paretorch.experiments.bench.busy import render, verdict


def _front(**rows: tuple[float, float, float]) -> dict[str, object]:
    return {"front": {recipe: {"trial": 1, "speedup": s, "ci": [low, high]} for recipe, (s, low, high) in rows.items()},
            "load_before": 0.1, "seconds": 1.0}


def test_passes_only_with_the_same_front_inside_the_quiet_intervals() -> None:
    quiet = _front(a=(1.3, 1.25, 1.35), b=(2.0, 1.9, 2.1))
    assert verdict(quiet, _front(a=(1.28, 1.2, 1.4), b=(2.05, 1.9, 2.2)))["passed"]
    outside = verdict(quiet, _front(a=(1.5, 1.4, 1.6), b=(2.0, 1.9, 2.1)))
    assert not outside["passed"] and outside["within_quiet_interval"] == {"a": False, "b": True}
    other_front = verdict(quiet, _front(a=(1.3, 1.25, 1.35)))
    assert not other_front["same_front"] and not other_front["passed"]


def test_render_names_each_recipe() -> None:
    quiet, busy = _front(a=(1.3, 1.25, 1.35)), _front(a=(1.31, 1.2, 1.4))
    result = {"model": "digits", "trials": 20, "core": 0, "busy_core": 1, "machine": "x86_64", "quiet": quiet,
              "busy": busy, "verdict": verdict(quiet, busy)}
    text = render(result)
    assert "**passed**" in text and "| a | 1.30x [1.25, 1.35] | 1.31x | yes |" in text
