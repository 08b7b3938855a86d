"""What a study's trials use, as one frozen record: the trial objective, its line and MLflow run, the front's
re-measure and exports receive it (built once a run by :meth:`paretorch.pipeline.search.study.Search.parts`), never the
:class:`~paretorch.pipeline.search.study.Search` that opened the study."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.engine.graph import Pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.config import SearchConfig
from paretorch.pipeline.search.objectives import Objectives
from paretorch.pipeline.search.rule_out import RuleOut
from paretorch.pipeline.search.study_latency import StudyLatency


@dataclass(frozen=True)
class StudyParts:
    """A study's model and device, its settings and objectives, the runtimes the device offers, and the runner,
    paired latency and rule-out facts its trials share."""

    spec: ModelSpec
    device: torch.device
    config: SearchConfig
    pipeline: Pipeline
    objectives: Objectives
    #: The config's runtimes that run on this device, in its order.
    runtimes: tuple[str, ...]
    study_name: str
    runner: Runner
    latency: StudyLatency
    rules: RuleOut
