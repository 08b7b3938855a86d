"""The search config (``pipeline/defaults/search.yaml`` + CLI overrides), the study's name, storage and sampler.

The fields and their checks are :mod:`paretorch.pipeline.search.schema` (loaded without torch, so that the command
line checks a config before torch loads); :class:`SearchConfig` and :class:`SeedRecipe` add what a study needs from
the stages and the tail guard.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

import optuna
import torch
from optuna.trial import TrialState

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.input_agreement import TailGuard
from paretorch.pipeline.core.paths import DEFAULT_SEARCH_CONFIG, results_dir
from paretorch.pipeline.core.runtimes.registry import check_runtime_names
from paretorch.pipeline.core.stage import config_from_dict
from paretorch.pipeline.engine.graph import Pipeline
from paretorch.pipeline.search.objectives import ATTR_ESTIMATE
from paretorch.pipeline.search.schema import ALL_RUNTIMES, PresetSchema, SearchSchema, SeedSchema, cli_flag

if TYPE_CHECKING:
    from paretorch.pipeline.core.spec import ModelSpec

__all__ = ["ALL_RUNTIMES", "DEFAULT_SEARCH_CONFIG", "LEGACY_DEFAULT_RUNTIMES", "Preset", "SearchConfig", "SeedRecipe",
           "cli_flag", "default_storage", "finished_states", "legacy_study_name", "legacy_study_names", "make_sampler",
           "study_name"]


class RegisteredRuntimes:
    """Runtime names checked against the runtime registry (entry points and the runtimes registered in this
    process), not the entry points alone as :class:`~paretorch.pipeline.search.schema.RuntimeNamed` does."""

    @classmethod
    def known_runtimes(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if names == ALL_RUNTIMES:
            return names
        try:
            return check_runtime_names(names)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


class Preset(RegisteredRuntimes, PresetSchema):
    """A cheap stage list tried alone before the seeds (:class:`~paretorch.pipeline.search.schema.PresetSchema`)."""


class SeedRecipe(RegisteredRuntimes, SeedSchema):
    """A trial enqueued before the sampler starts (:class:`~paretorch.pipeline.search.schema.SeedSchema`), with
    what its trial records: its stage configs validated by their stages and its estimate."""

    def trial_attrs(self) -> dict[str, object]:
        """User attrs the seed adds to its enqueued trial beyond its recipe: a proposal's estimate."""
        return {ATTR_ESTIMATE: self.estimate} if self.estimate else {}

    def payload(self) -> dict[str, object]:
        """The seed's runtime and validated stage dicts, as its trial records them (two seeds that would run the
        same trial have the same payload)."""
        return {"runtime": self.runtime, "stages": [config_from_dict(dict(raw)).to_dict() for raw in self.stages]}


class SearchConfig(RegisteredRuntimes, SearchSchema):
    """What is searched and how (:class:`~paretorch.pipeline.search.schema.SearchSchema`: the fields, their
    defaults and checks), its runtimes checked against the registry, with seeds that record their stage payload and
    the tail guard its fields set."""

    seeds: tuple[SeedRecipe, ...] = ()
    presets: tuple[Preset, ...] = ()

    def tail_guard(self) -> TailGuard:
        """The tail guard these fields set."""
        return TailGuard(self.tail_limit, self.tail_cosine)


def study_name(spec: ModelSpec, device: torch.device, config: SearchConfig, pipeline: Pipeline) -> str:
    """``<spec>-<device type>-<hash of spec source, search config and pipeline>``. The default pipeline is
    named by the search config alone (``pipeline: default``), not by its stage list: installing or adding a
    stage does not rename its studies (a resumed study records the stages it has,
    :mod:`paretorch.pipeline.search.store`). A pipeline file's nodes are hashed: they are what its trials mean."""
    payload: dict[str, object] = {"spec": spec.source or spec.name, "search": config.identity()}
    if config.pipeline != "default":
        payload["pipeline"] = pipeline.to_dict()
    return _hashed(spec, device, payload)


def legacy_study_name(spec: ModelSpec, device: torch.device, config: SearchConfig, pipeline: Pipeline) -> str:
    """The name :func:`study_name` gave before it stopped hashing the default pipeline's stage list
    (the migration rule in :func:`paretorch.pipeline.search.store.find_study` looks for it)."""
    return _hashed(spec, device, {"spec": spec.source or spec.name, "pipeline": pipeline.to_dict(),
                                  "search": config.identity()})


#: The default ``runtimes`` before it became ``all`` (every runtime available): a default study named then is
#: found under the name this list gave it (:func:`legacy_study_names`).
LEGACY_DEFAULT_RUNTIMES = ("eager", "compile", "compile_dynamic", "compile_cudagraphs", "onnxruntime", "openvino")


def legacy_study_names(spec: ModelSpec, device: torch.device, config: SearchConfig, pipeline: Pipeline
                       ) -> tuple[str, ...]:
    """The names earlier rules gave the study, newest first: the stage list hashed (:func:`legacy_study_name`),
    and for the default ``runtimes: all`` the names of the runtime list that was the default before."""
    names = [legacy_study_name(spec, device, config, pipeline)]
    if config.runtimes == ALL_RUNTIMES:
        listed = config.model_copy(update={"runtimes": LEGACY_DEFAULT_RUNTIMES})
        names += [study_name(spec, device, listed, pipeline), legacy_study_name(spec, device, listed, pipeline)]
    return tuple(names)


def _hashed(spec: ModelSpec, device: torch.device, payload: Mapping[str, object]) -> str:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{spec.name}-{device.type}-{digest}"


def default_storage() -> str:
    """``sqlite:///<results>/optuna.db``."""
    return f"sqlite:///{results_dir() / 'optuna.db'}"


def finished_states() -> tuple[TrialState, ...]:
    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


#: Sampler seeds of two workers are this far apart (workers of one study never share a seed).
WORKER_SEED_STRIDE = 100_003


def make_sampler(config: SearchConfig, finished: int, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler; its seed moves with the number of finished trials so a resumed
    study does not replay the first run's random start-up trials, and with the worker's
    index so that workers of one study do not sample the same configs."""
    seed = config.seed + finished + worker * WORKER_SEED_STRIDE
    if config.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if config.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # multivariate + group: a joint model per set of co-occurring params (stages switch on and off).
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=8,
                                           constant_liar=True)  # running trials (other workers) count as seen


