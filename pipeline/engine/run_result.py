"""What a :class:`~paretorch.pipeline.engine.runner.Runner` run produced: each node's result, the run's result (the
objective's report, the exports, the replayable recipe, the function its evaluation measured) and how often
each stage ran or hit the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.stage import ExportResult, StageConfig
from paretorch.pipeline.engine.graph import Pipeline
from paretorch.pipeline.engine.recipe import Recipe


@dataclass
class NodeResult:
    """What one node produced in one run."""

    name: str
    kind: str
    key: str
    value: Any
    config: StageConfig | None = None
    resolved: StageConfig | None = None
    cached: bool = False
    seconds: float = 0.0
    #: Resolved configs from the source up to and including this node (model nodes).
    chain: tuple[StageConfig, ...] = ()
    float_model: nn.Module | None = None
    records: dict[str, Any] = field(default_factory=dict)
    #: Evaluations under a runtime of an exported file: the export config that made the file it ran.
    runtime_export: StageConfig | None = None
    #: An evaluation that ran (not cached): the model as it was prepared for its runtime and measured (a compiled
    #: module, an exported file's session).
    prepared: Callable[..., Tensor] | None = field(default=None, repr=False, compare=False)
    #: Seconds of this node's time that belong to another time category (an exported runtime's ``exports`` and
    #: ``runtime_sessions``); the rest is the node's own.
    side_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        """False for a stage that was off (its value is its input's)."""
        return self.kind in ("source", "evaluate") or self.config is not None


@dataclass
class RunResult:
    """All node results of one run, the objective's report and the run's timings."""

    pipeline: Pipeline
    runtime: str
    nodes: dict[str, NodeResult]
    seconds: dict[str, float]
    cache_hits: int
    cache_misses: int
    #: The per-node configs the run was asked for (``Runner.run``'s ``configs``).
    configs: dict[str, StageConfig | None] = field(default_factory=dict)

    @property
    def objective(self) -> NodeResult:
        return self.nodes[self.pipeline.objective_node().name]

    @property
    def model(self) -> nn.Module:
        """The objective's model: the chain's last model (before any runtime prepared it)."""
        model: nn.Module = self.nodes[self.pipeline.objective_node().inputs[0]].value
        return model

    @property
    def prepared(self) -> Callable[..., Tensor] | None:
        """The objective's model of this run as its evaluation prepared and measured it; None when the
        evaluation came from the cache (or did not run): prepare it again from :attr:`configs`."""
        node = self.nodes.get(self.pipeline.objective_node().name)
        return node.prepared if node is not None else None

    @property
    def report(self) -> ModelReport:
        report: ModelReport = self.objective.value
        return report

    @property
    def exports(self) -> dict[str, ExportResult]:
        return {n.name: self.nodes[n.name].value for n in self.pipeline.export_nodes()
                if n.name in self.nodes and self.nodes[n.name].value is not None}

    @property
    def export_evaluations(self) -> dict[str, dict[str, Any]]:
        objective = self.pipeline.objective_node().name
        return {name: result.value for name, result in self.nodes.items()
                if result.kind == "evaluate" and name != objective and result.value is not None}

    def recipe(self, model: str | None, deferred_exports: Mapping[str, StageConfig | None] | None = None,
               metadata: Mapping[str, object] | None = None) -> Recipe:
        """The replayable recipe: the objective model's resolved chain, then its exports
        (resolved if they ran, else the configs in ``deferred_exports``)."""
        chain = list(self.nodes[self.pipeline.objective_node().inputs[0]].chain)
        for node in self.pipeline.export_nodes():
            result = self.nodes.get(node.name)
            if result is not None and result.config is not None:
                chain.append(result.resolved or result.config)
            elif deferred_exports and deferred_exports.get(node.name) is not None:
                chain.append(deferred_exports[node.name])  # type: ignore[arg-type]
        evaluated = self.nodes.get(self.pipeline.objective_node().name)  # None: a chain run without evaluation
        runtime_export = evaluated.runtime_export if evaluated is not None else None
        if runtime_export is not None:  # the file the runtime ran is the recipe's export of that stage
            chain = [c for c in chain if c.stage != runtime_export.stage] + [runtime_export]
        return Recipe(stages=tuple(chain), runtime=self.runtime, model=model, metadata=dict(metadata or {}))


@dataclass
class StageTally:
    """How often one stage ran (cache misses) or was answered by the cache, and the seconds it ran."""

    runs: int = 0
    hits: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        return f"{self.runs} run(s) in {self.seconds:.1f} s, {self.hits} cache hit(s)"
