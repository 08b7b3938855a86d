"""Compose before exploring: the cross product of measured winners under the winning runtimes."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from paretorch.pipeline.core.stage import StageConfig, config_from_dict
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search.compose import (
    COMPOSED_PREFIX,
    Measured,
    components,
    compositions,
    measured,
    winners,
)
from paretorch.pipeline.search.record import COMPLETE, TrialRecord

ORDER = ["prune", "distill", "quantize", "amp"]
PRUNE = config_from_dict({"stage": "prune", "ratio": 0.3})
DISTILL = config_from_dict({"stage": "distill", "steps": 100, "max_seconds": 300})
INT8 = config_from_dict({"stage": "quantize", "method": "int8_dynamic"})
INT8_WEIGHTS = config_from_dict({"stage": "quantize", "method": "int8_weight_only"})
BF16 = config_from_dict({"stage": "amp", "dtype": "bfloat16"})
BF16_RESOLVED = config_from_dict({"stage": "amp", "dtype": "bfloat16", "fp32_layers": ["head"]})
FP16 = config_from_dict({"stage": "amp", "dtype": "float16"})


def trial(number: int, runtime: str, stages: Sequence[StageConfig], speedup: float, drop: float = 0.0,
          resolved: Sequence[StageConfig] | None = None) -> Measured:
    requested = tuple((c.stage, c) for c in stages)
    return Measured(number, runtime, requested, tuple(resolved if resolved is not None else stages), speedup, drop)


def measured_study() -> list[Measured]:
    """Seeds and sweeps as a study runs them: the baseline, one technique each, a runtime sweep."""
    return [
        trial(0, "eager", [], 1.0),
        trial(1, "eager", [BF16], 1.5, 0.001, resolved=[BF16_RESOLVED]),
        trial(2, "eager", [FP16], 1.4, 0.002),
        trial(3, "eager", [INT8], 1.3, 0.004),
        trial(4, "eager", [PRUNE, DISTILL], 1.6, 0.003),
        trial(5, "compile", [], 2.0),
        # the runtime sweep replays trial 1's resolved AMP policy: the same technique as trial 1
        trial(6, "compile", [BF16_RESOLVED], 3.2, 0.001),
        trial(7, "eager", [INT8_WEIGHTS], 0.9, 0.001),  # slower than the plain model: no winner
        trial(8, "eager", [PRUNE, INT8], 1.9, 0.006),  # two techniques at once: not a single measurement
    ]


def nothing_known(configs: Sequence[StageConfig], runtime: str) -> bool:
    return False


def key(configs: Sequence[StageConfig]) -> str:
    return json.dumps([c.to_dict() for c in configs], sort_keys=True)


def test_components_keep_a_distillation_with_the_structure_it_recovers() -> None:
    parts = components([("prune", PRUNE), ("distill", DISTILL), ("quantize", INT8), ("amp", BF16)])
    assert [p.nodes for p in parts] == [("prune", "distill"), ("quantize",), ("amp",)]


def test_winners_are_single_techniques_that_beat_the_plain_model_under_their_runtime() -> None:
    found = {(w.component.nodes, key([c for _, c in w.component.stages])): w for w in winners(measured_study(), 2)}
    assert set(found) == {(("amp",), key([BF16])), (("amp",), key([FP16])), (("quantize",), key([INT8])),
                          (("prune", "distill"), key([PRUNE, DISTILL]))}
    bf16 = found[(("amp",), key([BF16]))]
    assert bf16.gain == 3.2 / 2.0 and bf16.number == 6, "the compiled replay, against the compiled plain model"
    best = [w.component.stages for w in winners(measured_study(), 1)]
    assert len(best) == 3 and (("amp", BF16),) in best, "one per axis: the best"


def test_compositions_are_the_cross_product_of_the_winners_under_the_winning_runtimes() -> None:
    options = compositions(measured_study(), ["eager", "compile", "compile_cudagraphs"], ORDER, 0.01,
                           known=nothing_known, limit=100)
    got = {(key(c.configs), c.runtime) for c in options}
    structure, quantize, amps = [PRUNE, DISTILL], [INT8], [[BF16], [FP16]]
    sets = [structure + quantize] + [structure + a for a in amps] + [quantize + a for a in amps] + [
        structure + quantize + a for a in amps]
    # compile_cudagraphs never ran: only the runtimes that won (compile 3.2x, eager 1.9x) are composed
    assert got == {(key(s), r) for s in sets for r in ("compile", "eager")}
    assert len(options) == len(got) == 14
    best = options[0]
    assert (key(best.configs), best.runtime) == (key([PRUNE, DISTILL, BF16]), "compile"), (
        "int8 and bf16 speed up the same matrix products: their gains do not multiply, and among equal "
        "estimates the composition with fewer techniques goes first")
    assert best.name == f"{COMPOSED_PREFIX}4+6" and best.estimated_drop <= 0.01
    assert best.estimated_gain == 1.6 * (3.2 / 2.0), "structure x the largest numeric gain"
    four = next(c for c in options if c.runtime == "compile" and len(c.winners) == 3 and c.winners[-1].number == 6)
    assert [n for n, _ in four.stages] == ["prune", "distill", "quantize", "amp"], "pipeline order"
    assert four.estimated_gain == best.estimated_gain and options.index(four) > options.index(best)


def test_compositions_are_bounded_new_and_deterministic() -> None:
    study = measured_study()
    everything = compositions(study, ["eager", "compile"], ORDER, 0.01, known=nothing_known, limit=100)
    assert compositions(study, ["eager", "compile"], ORDER, 0.01, known=nothing_known, limit=3) == everything[:3]
    shuffled = list(study)
    random.Random(0).shuffle(shuffled)
    assert compositions(shuffled, ["eager", "compile"], ORDER, 0.01, known=nothing_known, limit=100) == everything
    ran = {(key(c.configs), c.runtime) for c in everything[:2]}
    fresh = compositions(study, ["eager", "compile"], ORDER, 0.01, limit=100,
                         known=lambda configs, runtime: (key(configs), runtime) in ran)
    assert fresh == everything[2:], "a recipe already measured or queued is never proposed again"
    assert compositions(study, ["eager", "compile"], ORDER, 0.01, known=nothing_known, limit=0) == []


def test_likely_infeasible_compositions_come_last() -> None:
    """Drops add up: with an allowed drop of 0.005, three pairs are likely to hold (0.004, 0.005, 0.005)."""
    options = compositions(measured_study(), ["compile"], ORDER, 0.005, known=nothing_known, limit=100)
    assert [key(c.configs) for c in options[:3]] == [key([PRUNE, DISTILL, BF16]), key([PRUNE, DISTILL, FP16]),
                                                     key([INT8, BF16])]
    assert len(options) == 7 and all(c.estimated_drop > 0.005 for c in options[3:])


def test_only_feasible_complete_trials_are_measured_winners() -> None:
    recipe = Recipe(stages=(INT8,), runtime="eager")
    record = TrialRecord(number=3, state=COMPLETE, runtime="eager", configs={"quantize": INT8, "amp": None},
                         recipe=recipe, metrics={"speedup": 1.3, "metric_drop": 0.02})
    assert measured(record, feasible=False, export_nodes=()) is None
    ok = measured(record, feasible=True, export_nodes=())
    assert ok is not None and ok.requested == (("quantize", INT8),) and ok.drop == 0.02
    # an infeasible technique alone gives no composition
    only_infeasible = [trial(0, "eager", [], 1.0), trial(1, "eager", [BF16], 1.5)]
    assert compositions(only_infeasible, ["eager"], ORDER, 0.01, known=nothing_known, limit=10) == []
