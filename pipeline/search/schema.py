"""The search config's schema: every field, its default and its check, loaded without torch.

``python -m paretorch`` validates a ``--search-config`` file (YAML syntax, unknown keys, bad values) and the flags
that override it (``--max-drop``, ``--tail-limit``, ``--objectives`` ...) with :meth:`SearchSchema.load` before it
imports torch, so each such error costs a fraction of a second. This module imports pydantic, YAML and the
torch-free core alone (the runtime and budget names come from :mod:`paretorch.pipeline.core.names`, read from
entry points). :class:`paretorch.pipeline.search.config.SearchConfig` is the same schema with what a study needs
from the stages and the tail guard (:class:`~paretorch.pipeline.search.config.SeedRecipe`'s stage payload).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.names import (
    DEFAULT_LATENCY_BUDGET,
    DEFAULT_RUNTIME,
    LATENCY_BUDGET_NAMES,
    WORKLOADS,
    unknown_runtimes,
)
from paretorch.pipeline.core.paths import DEFAULT_SEARCH_CONFIG
from paretorch.pipeline.core.stage_config import format_validation_error
from paretorch.pipeline.core.tail_limit import COSINE_FLOOR, TAIL_LIMIT, parse_tail_limit
from paretorch.pipeline.core.yaml_file import read_yaml
from paretorch.pipeline.search.allowed_drop import DEFAULT_MAX_DROP, AllowedDrop

ObjectiveName = Literal["metric", "latency", "size"]
OBJECTIVE_NAMES: tuple[ObjectiveName, ...] = ("metric", "latency", "size")

#: The runtimes value that means every runtime available on the device (the default: a newly installed
#: runtime joins the study instead of renaming it).
ALL_RUNTIMES = ("all",)


class RuntimeNamed(BaseModel):
    """A model whose fields name runtimes: each name must be a runtime that an entry point declares (all the command
    line can know before torch loads) or :data:`ALL_RUNTIMES`. The config's models
    (:mod:`paretorch.pipeline.search.config`) check them against the runtime registry instead, which also holds the
    runtimes registered in this process (``registered_runtime``: tests, notebooks)."""

    @classmethod
    def known_runtimes(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        """``names`` unchanged when each is known (a device may lack some: they are dropped later, by the capability
        table); an unknown name is a typo, a ValueError naming the known ones."""
        if (problem := unknown_runtimes(names)) is not None:
            raise ValueError(problem)
        return names


class SeedSchema(RuntimeNamed):
    """A trial enqueued before the sampler starts: named stage configs and a runtime (the stage configs are
    validated by their stages: :meth:`paretorch.pipeline.search.config.SeedRecipe.payload`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    runtime: str = DEFAULT_RUNTIME
    stages: tuple[dict[str, object], ...] = ()
    #: A seed some devices cannot run (e.g. CPU-only int8), or that the model's facts rule out (depth pruning of a
    #: model without a removable block), is skipped there; otherwise it is an infeasible or ruled-out trial that
    #: says why (what a user's own seed should be). Dumped only when set: a field added later leaves the names of
    #: studies whose seeds do not use it unchanged.
    skip_where_unavailable: bool = Field(default=False, exclude_if=lambda value: not value)
    #: What a proposal's estimate started from (:mod:`paretorch.pipeline.search.dead_ends`): ``{"speedup", "under"}``
    #: for a runtime sweep, ``{"gain"}`` for a composition; checked again when the trial starts. Dumped only when set.
    estimate: dict[str, object] | None = Field(default=None, exclude_if=lambda value: value is None)

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, name: str) -> str:
        return cls.known_runtimes((name,))[0]


class PresetSchema(RuntimeNamed):
    """A cheap stage list (no training, no long calibration) tried alone before the seeds
    (:mod:`paretorch.pipeline.search.presets`), under each of ``runtimes`` the study offers, in that order."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    stages: tuple[dict[str, object], ...] = ()
    #: Where the preset can pay, in the order to try them (those the study does not offer are left out); None:
    #: every runtime of the study, eager last. E.g. PT2E int8 under eager runs reference kernels, slower than float.
    runtimes: tuple[str, ...] | None = None

    @field_validator("runtimes")
    @classmethod
    def _known_runtimes(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if names is None else cls.known_runtimes(tuple(names))


#: ``max_drop``: ``0.01`` (absolute) or ``"1%"`` (of the baseline metric); a bad value raises the flag's ConfigError.
MaxDrop = Annotated[AllowedDrop, PlainValidator(AllowedDrop.parse), PlainSerializer(AllowedDrop.to_json)]
#: ``tail_limit``: a share of the inputs (``"1%"``, ``0.02``) or ``"off"`` (None).
TailLimit = Annotated[float | None, PlainValidator(parse_tail_limit),
                      PlainSerializer(lambda share: "off" if share is None else share)]


class SearchSchema(RuntimeNamed):
    """What is searched and how (``pipeline/defaults/search.yaml``; CLI flags override fields)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pipeline: str = "default"
    objectives: tuple[ObjectiveName, ...] = ("metric", "latency")
    max_drop: MaxDrop = DEFAULT_MAX_DROP
    sampler: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int = 0
    #: The runtimes searched, intersected with the device's; ``all`` (the default): every runtime available there.
    runtimes: tuple[str, ...] = ALL_RUNTIMES
    #: A name of :data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS`: how long each trial is timed, alone and
    #: paired.
    latency_budget: str = DEFAULT_LATENCY_BUDGET
    latency_batch: int | None = Field(default=None, ge=1)
    disabled: tuple[str, ...] = ()
    exports: Literal["pareto", "every_trial", "none"] = "pareto"
    seeds: tuple[SeedSchema, ...] = ()
    #: Cheap precision presets, each tried alone under its runtimes before the seeds
    #: (:mod:`paretorch.pipeline.search.presets`).
    presets: tuple[PresetSchema, ...] = ()
    cache_mb: int = Field(default=2048, ge=0)
    #: Trials composed from measured winners at most (:mod:`paretorch.pipeline.search.compose`; 0: none).
    compose: int = Field(default=6, ge=0)
    #: The runtime sweep covers this many of the fastest feasible stage lists (:mod:`paretorch.pipeline.search.sweep`).
    sweep_top: int = Field(default=3, ge=1)
    #: Costly stages run at low fidelity first (:mod:`paretorch.pipeline.search.screening`).
    screening: bool = True
    #: Costly stages (distillation, calibration) may take at most this share of a run's wall time: past it, a
    #: costly trial stops at low fidelity (:mod:`paretorch.pipeline.search.screening`).
    costly_share: float = Field(default=0.25, gt=0.0, le=1.0)
    #: The tail guard (:mod:`paretorch.pipeline.core.input_agreement`): at most this share of the inputs may break
    #: (``1%``, ``0.02``; ``off``: no guard), an embedding input below ``tail_cosine`` to its unoptimized output.
    tail_limit: TailLimit = TAIL_LIMIT
    tail_cosine: float = Field(default=COSINE_FLOOR, gt=-1.0, le=1.0)
    #: How the model will be used, what its latency is timed on (:data:`paretorch.pipeline.core.workload.WORKLOADS`):
    #: ``serve`` (raw inputs to host outputs, batch by batch), ``corpus`` (a whole list, sorted by length) or ``model``
    #: (the model call alone on the device batch).
    workload: str = WORKLOADS[0]

    #: Fields that do not change what a trial measures (left out of the study's name): where results go,
    #: and which trials the search proposes besides its sampler's (a resumed study may change them).
    RUN_ONLY_FIELDS: ClassVar[frozenset[str]] = frozenset({"exports", "cache_mb", "compose", "sweep_top",
                                                            "screening", "presets", "costly_share"})
    #: Fields a study's name hashes only when set away from their defaults (added after studies were named by
    #: the others: a study begun before keeps its name under the defaults).
    LATER_FIELDS: ClassVar[frozenset[str]] = frozenset({"tail_limit", "tail_cosine"})

    @field_validator("runtimes", mode="before")
    @classmethod
    def _known_runtimes(cls, names: tuple[str, ...] | str) -> tuple[str, ...]:
        return cls.known_runtimes((names,) if isinstance(names, str) else tuple(names))

    #: The fields that take one name of a table, and how their errors call it.
    NAMED_FIELDS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "workload": ("workload", WORKLOADS), "latency_budget": ("latency budget", LATENCY_BUDGET_NAMES)}

    @field_validator(*NAMED_FIELDS)
    @classmethod
    def _known_name(cls, name: str, info: ValidationInfo) -> str:
        what, choices = cls.NAMED_FIELDS[str(info.field_name)]
        if name not in choices:
            raise ValueError(f"unknown {what} {name!r}: choose from {', '.join(choices)}")
        return name

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: object) -> Self:
        """Read a YAML search config (default ``pipeline/defaults/search.yaml``) and apply overrides (None = keep).
        Overriding ``seeds`` without ``presets`` turns the presets off: the given seeds are all that is enqueued.
        Every problem is one :class:`ConfigError` line naming the file or the flag."""
        source = Path(path) if path else DEFAULT_SEARCH_CONFIG
        data = read_config_file(source) if source.is_file() or path else {}
        given = {k: v for k, v in overrides.items() if v is not None}
        if "seeds" in given and "presets" not in given:
            given["presets"] = ()  # a caller that lists the seeds lists every trial enqueued before the sampler
        data.update(given)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            flags = sorted({cli_flag(str(e["loc"][0])) for e in exc.errors() if e["loc"] and e["loc"][0] in given})
            if flags:
                raise ConfigError(f"{', '.join(flags)}: {format_validation_error(exc)}") from exc
            raise ConfigError(f"invalid search config ({source.name}): {format_validation_error(exc)}; fix {source} "
                              f"(every field, with its default: {DEFAULT_SEARCH_CONFIG})") from exc

    def identity(self) -> dict[str, object]:
        """What a study's name hashes: every field that changes what a trial measures."""
        later = {name for name in self.LATER_FIELDS if getattr(self, name) == type(self).model_fields[name].default}
        return self.model_dump(mode="json", exclude=set(self.RUN_ONLY_FIELDS) | later)


def read_config_file(source: Path) -> dict[str, object]:
    """The mapping a YAML search config file holds; a missing file, a YAML error or a top level that is not a
    mapping is one :class:`ConfigError` line."""
    if not source.is_file():
        raise ConfigError(f"search config not found: {source} (pass the path of a YAML file; the defaults are "
                          f"{DEFAULT_SEARCH_CONFIG})")
    data = read_yaml(source, "--search-config") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a search config is a mapping of fields (pipeline: ..., max_drop: ...), "
                          f"not a {type(data).__name__}")
    return data


def cli_flag(field_name: str) -> str:
    """The command-line flag that sets a search config field (``max_drop`` -> ``--max-drop``)."""
    return {"disabled": "--disable"}.get(field_name, "--" + field_name.replace("_", "-"))
