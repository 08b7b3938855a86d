"""The AMP sensitivity table logged with each calibrated trial."""

from __future__ import annotations

from types import SimpleNamespace

from paretorch.pipeline.search.stage_records import sensitivity_tables
from paretorch.stages.amp.stage import AmpConfig


def test_sensitivity_table_lists_costliest_layers_first_and_what_stayed_float() -> None:
    amp = SimpleNamespace(
        resolved=AmpConfig(dtype="bfloat16", fp32_layers=("classifier.1",)),
        records={"amp.sensitivity": {"features.0": 0.001, "classifier.1": 0.02, "classifier.3": 0.004},
                 "amp.pinned": {"classifier.3": "output layer"}},
    )
    tables = sensitivity_tables({"prune": SimpleNamespace(records={}, resolved=None), "amp": amp})
    assert list(tables) == ["amp_sensitivity.csv"]
    assert tables["amp_sensitivity.csv"].splitlines() == [
        "layer,error_alone_reduced,kept_float32,why",
        "classifier.1,0.02,true,",
        "classifier.3,0.004,false,output layer",
        "features.0,0.001,false,",
    ]
