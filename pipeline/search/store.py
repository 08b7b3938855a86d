"""Where one study is kept: its Optuna storage and lock, the study it opens or resumes, and what it measured once.

:class:`StudyStore` opens the storage once (each open of a URL re-checks the schema: seconds), holds the study's lock
(:class:`~paretorch.pipeline.search.storage.StudyLock`, shared by all workers), finds the study to resume and opens it,
and keeps the study's own measurements in its user attrs, each read back on a resumed study or measured once now: the
unoptimized model's self-check (:data:`ATTR_SELF_CHECK`), the baseline, the metric's noise floor
(:data:`ATTR_NOISE_FLOOR`) and what pays on this machine (:data:`ATTR_MACHINE_PROBE`). :class:`Prepared` is a study
ready for its trials. What the study searches is its plan (:mod:`paretorch.pipeline.search.plan`).

**Study names that survive a new stage.** The default study name (:func:`paretorch.pipeline.search.config.study_name`)
does not hash the default pipeline's stage list, so installing or adding a stage keeps it. One migration rule finds the
studies named before that change (:func:`find_study`): a study answers to its *key* (the current default name) when
its name is the key, when it recorded the key, or when its name is the key's legacy form
(:func:`paretorch.pipeline.search.config.legacy_study_name`: the stage list as installed now). A study found the legacy
way keeps its name and records the key when opened (:data:`ATTR_STUDY_KEY`), so a stage added later still finds it.
The same rule finds a default study named while the default ``runtimes`` was a list
(:data:`paretorch.pipeline.search.config.LEGACY_DEFAULT_RUNTIMES`), before it became ``all``.

Each opened study records its pipeline's stage nodes (:data:`ATTR_STAGES`) and the runtimes it searches
(:data:`ATTR_RUNTIMES`; by default every runtime available on the device, so installing a plugin renames no
study). Resuming with another set (a plugin stage or runtime installed or removed) would change the study's
search space silently, so it is refused with what changed, unless the run accepts it
(``--accept-plugin-change``): then a stage that joins enters the search space (Optuna takes new params as they
come: the trials before it ran with the stage off). A stage its trials used that is no longer installed cannot
be read back, so the study cannot resume at all: :func:`stage_change` says so in one line.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from paretorch.pipeline.core.errors import ConfigError, PipelineError
from paretorch.pipeline.core.evaluate import Known
from paretorch.pipeline.core.machine_probe import MachineProbe, probe_machine
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.noise_floor import NoiseFloor, noise_floor
from paretorch.pipeline.core.runtimes.registry import declared_probes
from paretorch.pipeline.core.secrets import mask_secrets
from paretorch.pipeline.core.self_check import SelfCheck, require_stable, self_check
from paretorch.pipeline.core.stage import registered_stages
from paretorch.pipeline.search.config import finished_states, legacy_study_names, make_sampler, study_name
from paretorch.pipeline.search.objectives import ATTR_BASELINE, ATTR_CONFIGS, ATTR_SEARCH, Baseline
from paretorch.pipeline.search.plan import StudyModel, StudyPlan
from paretorch.pipeline.search.storage import StudyLock, fail_dead_trials, open_storage

#: Study user attr: the unoptimized model's self-check (paretorch.pipeline.core.self_check), measured once per study.
ATTR_SELF_CHECK = "self_check"
#: Study user attr: the metric's noise floor (:class:`paretorch.pipeline.core.noise_floor.NoiseFloor`), measured once.
ATTR_NOISE_FLOOR = "paretorch.noise_floor"
#: Study user attr: what pays on this machine (paretorch.pipeline.core.machine_probe), measured once per study.
ATTR_MACHINE_PROBE = "machine_probe"
#: Study user attr: the default name the study answers to (set on every open; see :func:`find_study`).
ATTR_STUDY_KEY = "paretorch.study_key"
#: Study user attr: the pipeline's stage nodes as ``name:op`` (model stages and exports), in order.
ATTR_STAGES = "paretorch.stages"
#: Study user attr: the runtimes the study searches on its device, in the console's order.
ATTR_RUNTIMES = "paretorch.runtimes"
#: The flag that resumes a study whose stages or runtimes changed since its last run.
ACCEPT_FLAG = "--accept-plugin-change"


@dataclass(frozen=True)
class Prepared:
    """A study ready for its trials: its baseline, what pays on this machine, and what the console says first (None:
    nothing to say)."""

    baseline: Baseline
    #: What pays on this machine (:mod:`paretorch.pipeline.core.machine_probe`; None: not probed).
    machine: MachineProbe | None = None
    #: The unoptimized model's self-check (:func:`paretorch.pipeline.core.self_check.require_stable`).
    self_check_line: str | None = None
    #: What changed in a resumed study's stages (:func:`stage_change`).
    stages_line: str | None = None
    #: The precision presets enqueued first (:mod:`paretorch.pipeline.search.presets`).
    presets_line: str | None = None
    #: The metric at its noise floor (:mod:`paretorch.pipeline.core.noise_floor`; None: it is not).
    noise_line: str | None = None
    #: The start's own seconds, outside the runner's tallies (the time split's study_start; set by the search loop).
    start_seconds: float = 0.0

    def lines(self) -> list[str]:
        """The lines to print, in order: the self-check, the noise floor, the stages' changes, the machine probe, the
        presets."""
        probe_line = self.machine.describe() if self.machine is not None else None
        return [line for line in (self.self_check_line, self.noise_line, self.stages_line, probe_line,
                                  self.presets_line) if line]


class StudyStore:
    """Where the study of ``plan`` is kept (see the module docstring): ``url``, its Optuna storage; ``name``, the
    study's (None: the default name, or the stored study that answers to it); ``tracking_uri`` and ``track``, its
    MLflow runs; ``accept_plugin_change``, resume a study whose stages or runtimes changed; ``allow_nondeterministic``,
    go on when the unoptimized model's metric moves between passes."""

    def __init__(self, plan: StudyPlan, url: str, name: str | None = None, *, tracking_uri: str | None = None,
                 track: bool = True, accept_plugin_change: bool = False, allow_nondeterministic: bool = False) -> None:
        self.plan = plan
        self.url = url
        self.tracking_uri = tracking_uri
        self.track = track
        self.accept_plugin_change = accept_plugin_change
        self.allow_nondeterministic = allow_nondeterministic
        self._given_name = name
        self._name = name
        self._backend: optuna.storages.BaseStorage | None = None

    @property
    def study_name(self) -> str:
        """``--study-name``, else the stored study that answers to the default name (:func:`find_study`), else the
        default name. Looked up in the storage once."""
        if self._name is None:
            plan = self.plan
            key = study_name(plan.spec, plan.device, plan.config, plan.pipeline)
            legacy = legacy_study_names(plan.spec, plan.device, plan.config, plan.pipeline)
            stored = {s.study_name: s.user_attrs for s in self.backend().get_all_studies()}
            self._name = find_study(stored, key, legacy)
        return self._name

    @property
    def label(self) -> str:
        """The storage URL with any password masked: the form to print, log or tag."""
        return mask_secrets(self.url)

    def backend(self) -> optuna.storages.BaseStorage:
        """The Optuna storage, opened once."""
        if self._backend is None:
            self._backend = open_storage(self.url)
        return self._backend

    def lock(self) -> StudyLock:
        """The study's lock, shared by all workers (see :mod:`paretorch.pipeline.search.storage`)."""
        return StudyLock(self.url, self.backend(), self.study_name)

    def study_names(self) -> list[str]:
        return [s.study_name for s in self.backend().get_all_studies()]

    def open_study(self, create: bool = True) -> optuna.Study:
        """Create or load the study (``create=False``: it must exist)."""
        return self.open(create)[0]

    def open(self, create: bool) -> tuple[optuna.Study, str | None]:
        """The study, and what changed in its stages since its last run (None: nothing, or not a run)."""
        # ERROR: a failed or interrupted trial gets our one line, not Optuna's warning and traceback.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        with self.lock():  # get-or-create: workers starting together create the study once
            study, stages_line = self._open_study(create)
            fail_dead_trials(study)
        finished = len(study.get_trials(deepcopy=False, states=finished_states()))
        study.sampler = make_sampler(self.plan.config, finished, self.plan.worker)
        return study, stages_line

    def _open_study(self, create: bool) -> tuple[optuna.Study, str | None]:
        objectives, name = self.plan.objectives, self.study_name
        exists = name in self.study_names()
        if not exists and not create:
            raise PipelineError(f"no study '{name}' in {self.label}")
        if exists:
            study = optuna.load_study(study_name=name, storage=self.backend())
            if [d.name.lower() for d in study.directions] != objectives.directions():
                raise ConfigError(f"study '{name}' optimizes {study.metric_names} "
                                  f"({[d.name.lower() for d in study.directions]}), not "
                                  f"{objectives.metric_names()}: choose another --study-name")
        else:
            study = optuna.create_study(study_name=name, storage=self.backend(), directions=objectives.directions())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(objectives.metric_names())
            study.set_user_attr(ATTR_SEARCH, self.plan.config.model_dump(mode="json"))
        # a run of the study records its stages (``report`` only reads it)
        return study, self._record_stages(study) if create else None

    def _record_stages(self, study: optuna.Study) -> str | None:
        """Record the stages and runtimes this run searches (and, on the default name, the name the study answers
        to); what changed since the study's last run. A :class:`ConfigError` when they changed and the run did not
        accept it (``accept_plugin_change``), or when its trials used a stage that is not installed now."""
        plan, name = self.plan, self.study_name
        current = [f"{n.name}:{n.op}" for n in plan.pipeline.stage_nodes()]
        stored = study.user_attrs.get(ATTR_STAGES)
        installed = registered_stages()
        uninstalled = {s.partition(":")[2] for s in stored or () if s.partition(":")[2] not in installed}
        used = {raw.get("stage") for t in study.get_trials(deepcopy=False) if uninstalled
                for raw in t.user_attrs.get(ATTR_CONFIGS, {}).values() if raw}
        unreadable = [s for s in stored or () if s.partition(":")[2] in uninstalled & used]
        line = stage_change(name, stored, current, unreadable)
        runtimes = runtime_change(study.user_attrs.get(ATTR_RUNTIMES), plan.runtimes)
        require_accepted(name, [c for c in (line, runtimes) if c], self.accept_plugin_change)
        if runtimes is not None:
            line = f"{line}; {runtimes}" if line else f"study {name}: {runtimes}"
        if stored != current:
            study.set_user_attr(ATTR_STAGES, current)
        if study.user_attrs.get(ATTR_RUNTIMES) != list(plan.runtimes):
            study.set_user_attr(ATTR_RUNTIMES, list(plan.runtimes))
        if self._given_name is None:
            key = study_name(plan.spec, plan.device, plan.config, plan.pipeline)
            if study.user_attrs.get(ATTR_STUDY_KEY) != key:
                study.set_user_attr(ATTR_STUDY_KEY, key)
        return line

    # ------------------------------------------------------------------ what the study measured once

    def self_check(self, study: optuna.Study, model: StudyModel) -> str | None:
        """The stored self-check, or score the unoptimized model again, re-batched, now (its first scoring read from
        the model's reference outputs, which the baseline's evaluation reads too); raises if its metric moves, unless
        :attr:`allow_nondeterministic`. Recorded on the study once it passes (or is allowed). Its one line for the
        console (None: nothing to say)."""
        spec = self.plan.spec
        stored = study.user_attrs.get(ATTR_SELF_CHECK)
        check = SelfCheck(**stored) if stored is not None else self_check(
            model.runner.model, spec, self.plan.device, reference=model.reference())
        line = require_stable(check, spec.name, self.allow_nondeterministic)
        if stored is None:
            study.set_user_attr(ATTR_SELF_CHECK, check.to_dict())
        return line

    def baseline(self, study: optuna.Study, model: StudyModel) -> Baseline:
        """The stored baseline, or measure the unoptimized model now (eager, its evaluation on the reference outputs)
        and store it."""
        stored = study.user_attrs.get(ATTR_BASELINE)
        if stored is not None:
            return Baseline(**stored)
        result = model.runner.run({}, DEFAULT_RUNTIME, exports=False, known=Known(outputs=model.reference()))
        workload_ms = model.latency.baseline_alone().p50_ms if model.latency.workload is not None else None
        baseline = self.plan.objectives.baseline_from(result.report, trial=None, workload_ms=workload_ms)
        study.set_user_attr(ATTR_BASELINE, json.loads(baseline.to_json()))
        return baseline

    def noise_floor(self, study: optuna.Study, model: StudyModel, baseline: Baseline) -> str | None:
        """The stored noise floor of the study's metric, or measure it now (:mod:`paretorch.pipeline.core.noise_floor`):
        its warning line, None when the metric is above it."""
        plan = self.plan
        stored, check = study.user_attrs.get(ATTR_NOISE_FLOOR), study.user_attrs.get(ATTR_SELF_CHECK)
        floor = NoiseFloor(**stored) if stored is not None else noise_floor(
            model.runner.model, plan.spec, plan.device, model.reference(), model.input_reference.output_kind,
            SelfCheck(**check).spread if check is not None else 0.0, plan.objectives.threshold(baseline))
        if stored is None:
            study.set_user_attr(ATTR_NOISE_FLOOR, floor.to_dict())
        return floor.line(plan.spec.metric.name)

    def machine_probe(self, study: optuna.Study) -> MachineProbe:
        """What pays (:mod:`paretorch.pipeline.core.machine_probe`), stored on the study; a resumed one reads it."""
        stored = study.user_attrs.get(ATTR_MACHINE_PROBE)
        if stored is not None:
            return MachineProbe(**stored)
        probe = probe_machine(self.plan.device, *declared_probes(list(self.plan.runtimes), self.plan.device))
        study.set_user_attr(ATTR_MACHINE_PROBE, probe.to_dict())
        return probe


# ------------------------------------------------------------------ study names


def find_study(studies: Mapping[str, Mapping[str, Any]], key: str, legacy: str | Sequence[str]) -> str:
    """The stored study (``studies``: name -> user attrs) that answers to ``key`` (see the module
    docstring), or to one of its ``legacy`` names, in order; ``key`` when there is none."""
    if key in studies:
        return key
    recorded = sorted(name for name, attrs in studies.items() if attrs.get(ATTR_STUDY_KEY) == key)
    if recorded:
        return recorded[0]
    return next((name for name in ([legacy] if isinstance(legacy, str) else legacy) if name in studies), key)


def stage_change(study_name: str, stored: Sequence[str] | None, current: Sequence[str],
                 unreadable: Collection[str] = ()) -> str | None:
    """What changed in a resumed study's stages (one line for the console), None if nothing did.
    ``unreadable``: stored stages that are not installed now and that some trial used: its record cannot be
    read back, so the study cannot resume (a :class:`ConfigError` that says so)."""
    if stored is None:
        return None
    if unreadable:
        raise ConfigError(f"study {study_name} has trials with stage(s) {', '.join(unreadable)}, which are not "
                          f"installed now: install them again to resume it, or start another study with "
                          f"--study-name NAME")
    joined = [s for s in current if s not in stored]
    left = [s for s in stored if s not in current]
    if not joined and not left:
        return None
    parts = []
    if joined:
        parts.append(f"{', '.join(joined)} joined its search space (its earlier trials ran with them off)")
    if left:
        parts.append(f"{', '.join(left)} left it (not in this pipeline)")
    return f"study {study_name}: " + "; ".join(parts)


def runtime_change(stored: Sequence[str] | None, current: Sequence[str]) -> str | None:
    """What changed in a resumed study's runtimes (a phrase), None if nothing did or nothing was recorded."""
    if stored is None:
        return None
    joined = [r for r in current if r not in stored]
    left = [r for r in stored if r not in current]
    parts = ([f"runtime(s) {', '.join(joined)} joined"] if joined else []) + (
        [f"runtime(s) {', '.join(left)} left"] if left else [])
    return "; ".join(parts) or None


def require_accepted(study_name: str, changes: Sequence[str], accepted: bool) -> None:
    """A :class:`ConfigError` when a resumed study's stages or runtimes changed and the run did not accept it."""
    if changes and not accepted:
        raise ConfigError(f"study {study_name} was begun with other stages or runtimes ({'; '.join(changes)}): "
                          f"resuming would change its search space; start a new study with --study-name NAME, or "
                          f"pass {ACCEPT_FLAG} to resume it with the installed set")
