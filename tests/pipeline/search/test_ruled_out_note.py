"""The end-of-search note on ruled-out configurations: one line per distinct reason, with its count."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState, create_trial

from paretorch.pipeline.search.rule_out import ATTR_RULED_OUT, ATTR_RULED_OUT_COUNTS, summarize

AMP = "onnxruntime: ONNX Runtime does not reproduce AMP (float32 layers kept)"
DEPTH = "prune: no removable block in this model"


def test_one_line_per_distinct_reason_with_its_count() -> None:
    study = optuna.create_study()
    assert summarize(study) is None
    for reason in [AMP] * 5 + [DEPTH]:
        study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={ATTR_RULED_OUT: reason}))
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    lines = (summarize(study) or "").splitlines()
    assert lines[0].startswith("6 configuration(s) ruled out before running") and AMP not in lines[0]
    assert lines[1:] == [f"  5 x {AMP}", f"  1 x {DEPTH}"]
    assert study.user_attrs[ATTR_RULED_OUT_COUNTS] == {AMP: 5, DEPTH: 1}
