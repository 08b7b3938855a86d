"""The low-fidelity configs a search screens costly stages with (distillation steps, calibration batches)."""

from __future__ import annotations

from paretorch.pipeline.core.stage import config_from_dict
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.quantize.stage import QuantizeConfig


def test_a_screened_distillation_runs_a_quarter_of_the_steps_and_time() -> None:
    full = DistillConfig(steps=400, max_seconds=300.0)
    short = full.low_fidelity()
    assert short is not None and (short.steps, short.max_seconds, short.stop_step) == (100, 75.0, None)
    assert short.lr == full.lr and short.schedule == full.schedule
    replay = DistillConfig(steps=400, stop_step=51).low_fidelity()
    assert replay is not None and (replay.steps, replay.stop_step) == (100, 13)
    assert DistillConfig(steps=4).low_fidelity() is None, "cheap already"


def test_a_screened_calibration_reads_one_batch_in_a_quarter_of_the_time() -> None:
    calibrating = QuantizeConfig(method="int8_dynamic", fallback_budget=0.01, calibration_batches=4,
                                 calibration_seconds=120.0)
    short = calibrating.low_fidelity()
    assert short is not None and (short.calibration_batches, short.calibration_seconds) == (1, 30.0)
    assert short.to_dict() != calibrating.to_dict(), "another node of the cache"
    assert QuantizeConfig(method="int8_dynamic").low_fidelity() is None, "no calibration: nothing costly"
    replay = QuantizeConfig(method="int8_dynamic", fallback_budget=0.01, float_layers=("head",))
    assert replay.low_fidelity() is None, "a replayed policy does not calibrate"


def test_other_stages_have_nothing_to_screen() -> None:
    for raw in ({"stage": "prune", "ratio": 0.3}, {"stage": "amp"}):
        assert config_from_dict(raw).low_fidelity() is None
