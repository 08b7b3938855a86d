"""The pipeline as a DAG of named artifacts: :class:`Node` and :class:`Pipeline`.

A node produces one named artifact from the artifacts named in ``inputs``:

* ``op="model"``: the source, the spec's trained model (exactly one per pipeline);
* ``op=<stage name>`` (``prune``, ``quantize``, ``export.onnx`` ...): a registered
  stage; its config is fixed on the node or chosen per trial (``None`` = off, the
  node passes its input through unchanged);
* ``op="evaluate"``: measurements of a model (metric, latency, size ...) or of an
  export (what its exporter checked).

The default pipeline::

    model -> prune -> distill -> quantize -> amp -> {export.coreml, export.onnx}
                                   \\-> evaluate

Pipelines are checked at construction with :mod:`graphlib` (cycles, missing
inputs, duplicate outputs, wrong kinds of inputs) and compose with ``+``.
Custom pipelines come from Python (``Pipeline([...])``) or from a YAML file
(:func:`load_pipeline`; see ``pipeline/defaults/pipelines/``).
"""

from __future__ import annotations

import graphlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.paths import pipeline_file
from paretorch.pipeline.core.stage import Stage, StageConfig, config_from_dict, default_order, get_stage, is_export
from paretorch.pipeline.core.yaml_file import read_yaml

SOURCE_OP = "model"
EVALUATE_OP = "evaluate"
NodeKind = Literal["source", "model", "export", "evaluate"]

@dataclass(frozen=True)
class Node:
    """One artifact of a pipeline: its name, the operation that makes it and its inputs.

    ``config`` fixes a stage node's config; without it the search chooses one per
    trial (the stage's ``suggest``), and ``None`` at run time means "off".
    """

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    config: StageConfig | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError(f"a pipeline node needs a non-empty name, got {self.name!r}")
        if isinstance(self.inputs, str):
            object.__setattr__(self, "inputs", (self.inputs,))
        else:
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.config is not None and self.config.stage != self.op:
            raise ConfigError(f"node '{self.name}': a {self.config.stage} config cannot configure op '{self.op}'")

    @property
    def is_stage(self) -> bool:
        return self.op not in (SOURCE_OP, EVALUATE_OP)

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"name": self.name, "op": self.op, "inputs": list(self.inputs)}
        if self.config is not None:
            data["config"] = {k: v for k, v in self.config.to_dict().items() if k != "stage"}
        return data


class Pipeline:
    """A checked DAG of :class:`Node` s, kept in a topological order."""

    def __init__(self, nodes: Iterable[Node], name: str = "custom") -> None:
        self.name = name
        self._nodes: dict[str, Node] = {}
        for node in nodes:
            if node.name in self._nodes:
                raise ConfigError(f"pipeline '{name}': two nodes produce '{node.name}' (node names must be unique)")
            self._nodes[node.name] = node
        self._kinds: dict[str, NodeKind] = {}
        self.order: tuple[str, ...] = self._check()

    # ------------------------------------------------------------------ checks

    def _check(self) -> tuple[str, ...]:
        sources = [n.name for n in self._nodes.values() if n.op == SOURCE_OP]
        if len(sources) != 1:
            raise ConfigError(f"pipeline '{self.name}' needs exactly one '{SOURCE_OP}' node, found {len(sources)}")
        for node in self._nodes.values():
            for ref in node.inputs:
                if ref not in self._nodes:
                    raise ConfigError(
                        f"pipeline '{self.name}': node '{node.name}' reads '{ref}', which no node produces "
                        f"(nodes: {', '.join(self._nodes)})"
                    )
        sorter = graphlib.TopologicalSorter({n.name: n.inputs for n in self._nodes.values()})
        try:
            order = tuple(sorter.static_order())
        except graphlib.CycleError as exc:
            raise ConfigError(f"pipeline '{self.name}' has a cycle: {' -> '.join(exc.args[1])}") from exc
        for name in order:
            self._kinds[name] = self._kind_of(self._nodes[name])
        return order

    def _kind_of(self, node: Node) -> NodeKind:
        if node.op == SOURCE_OP:
            if node.inputs:
                raise ConfigError(f"node '{node.name}': the model source takes no inputs")
            return "source"
        if len(node.inputs) != 1:
            raise ConfigError(f"node '{node.name}' ({node.op}) needs exactly one input, got {len(node.inputs)}")
        input_kind = self._kinds[node.inputs[0]]
        if node.op == EVALUATE_OP:
            if input_kind == "evaluate":
                raise ConfigError(f"node '{node.name}': cannot evaluate an evaluation ('{node.inputs[0]}')")
            return "evaluate"
        stage = get_stage(node.op)
        if input_kind not in ("source", "model"):
            raise ConfigError(f"node '{node.name}' ({node.op}) needs a model input; '{node.inputs[0]}' is {input_kind}")
        return "export" if stage.is_export else "model"

    # ------------------------------------------------------------------ access

    def __iter__(self) -> Iterator[Node]:
        return (self._nodes[name] for name in self.order)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def node(self, name: str) -> Node:
        if name not in self._nodes:
            raise ConfigError(f"pipeline '{self.name}' has no node '{name}' (nodes: {', '.join(self._nodes)})")
        return self._nodes[name]

    def kind(self, name: str) -> NodeKind:
        return self._kinds[name]

    def stage(self, name: str) -> Stage:
        """The registered stage a stage node runs."""
        node = self.node(name)
        if not node.is_stage:
            raise ConfigError(f"node '{name}' is not a stage node")
        return get_stage(node.op)

    @property
    def source(self) -> Node:
        return next(n for n in self if n.op == SOURCE_OP)

    def stage_nodes(self) -> list[Node]:
        """Stage nodes (model transforms and exports) in topological order."""
        return [n for n in self if n.is_stage]

    def model_stage_nodes(self) -> list[Node]:
        return [n for n in self if self._kinds[n.name] == "model"]

    def export_nodes(self) -> list[Node]:
        return [n for n in self if self._kinds[n.name] == "export"]

    def evaluation_nodes(self) -> list[Node]:
        return [n for n in self if n.op == EVALUATE_OP]

    def objective_node(self) -> Node:
        """The evaluation the search optimizes: the first evaluation of a torch model."""
        for node in self.evaluation_nodes():
            if self._kinds[node.inputs[0]] in ("source", "model"):
                return node
        raise ConfigError(f"pipeline '{self.name}' has no evaluation of a model: add an 'evaluate' node")

    def ancestors(self, name: str) -> list[str]:
        """Every node ``name`` depends on (itself included), in topological order."""
        needed = {name}
        stack = [name]
        while stack:
            for parent in self.node(stack.pop()).inputs:
                if parent not in needed:
                    needed.add(parent)
                    stack.append(parent)
        return [n for n in self.order if n in needed]

    def downstream_of_exports(self) -> set[str]:
        """Export nodes and everything that reads them (skipped when exports are deferred)."""
        names: set[str] = set()
        for node in self:
            if self._kinds[node.name] == "export" or any(i in names for i in node.inputs):
                names.add(node.name)
        return names

    # ------------------------------------------------------------------ composition and text

    def __add__(self, other: Pipeline) -> Pipeline:
        """Union of two pipelines; nodes present in both must be identical."""
        merged: dict[str, Node] = dict(self._nodes)
        for node in other:
            if node.name in merged and merged[node.name] != node:
                raise ConfigError(f"cannot compose pipelines: both define a different node '{node.name}'")
            merged[node.name] = node
        return Pipeline(merged.values(), name=f"{self.name}+{other.name}")

    def describe(self) -> str:
        """One line: ``model -> prune -> distill -> quantize -> amp -> {export.coreml, export.onnx}``."""

        def label(node: Node) -> str:
            text = node.name if node.op == node.name else f"{node.name}:{node.op}"
            return text + ("[fixed]" if node.config is not None else "")

        def render(name: str) -> str:
            children = [n for n in self if name in n.inputs and n.op != EVALUATE_OP]
            head = label(self._nodes[name])
            if not children:
                return head
            if len(children) == 1:
                return f"{head} -> {render(children[0].name)}"
            return f"{head} -> {{{', '.join(render(c.name) for c in children)}}}"

        return render(self.source.name)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "nodes": [n.to_dict() for n in self]}

    @classmethod
    def from_dict(cls, data: Mapping[str, object], name: str = "custom") -> Pipeline:
        """Build from ``{"name": ..., "nodes": [{"name", "op", "inputs", "config"}, ...]}``.

        ``inputs`` defaults to the previous node in the list, so a chain needs no inputs at all.
        """
        described = data.get("nodes") if isinstance(data, Mapping) else None
        if not isinstance(described, list):
            raise ConfigError("a pipeline description needs a 'nodes' list")
        nodes: list[Node] = []
        for index, raw in enumerate(described):
            if not isinstance(raw, Mapping) or "op" not in raw:
                raise ConfigError(f"pipeline node #{index + 1} must be a mapping with an 'op', got {raw!r}")
            unknown = set(raw) - {"name", "op", "inputs", "config"}
            if unknown:
                raise ConfigError(f"pipeline node #{index + 1}: unknown keys {sorted(unknown)}")
            op = str(raw["op"])
            inputs = raw.get("inputs", [nodes[-1].name] if nodes and op != SOURCE_OP else [])
            config = None
            if raw.get("config") is not None:
                config = config_from_dict({"stage": op, **dict(raw["config"])})
            nodes.append(Node(name=str(raw.get("name", op)), op=op, inputs=tuple(inputs), config=config))
        return cls(nodes, name=str(data.get("name", name)))


def default_pipeline(exports: Iterable[str] | None = None) -> Pipeline:
    """The registered model stages in their ``order`` (``model -> prune -> distill -> quantize -> amp``),
    the torch model evaluated, then the exports off the last model stage, each evaluated.

    ``exports``: export stage names to include (default: every export with an ``order``).
    Where each stage sits is declared by the stage itself (:attr:`Stage.order`).
    """
    model_stages, default_exports = default_order()
    export_names = [s.name for s in default_exports] if exports is None else list(exports)
    for name in export_names:
        if not get_stage(name).is_export:
            raise ConfigError(f"'{name}' is not an export stage")
    return chain_pipeline([s.name for s in model_stages], export_names, name="default")


def chain_pipeline(
    model_stages: Iterable[str | StageConfig], exports: Iterable[str | StageConfig] = (), name: str = "recipe"
) -> Pipeline:
    """A linear pipeline: model stages in order, the last model evaluated, exports off it.

    Each item is a stage name (a node the search configures) or a fixed config. Node names
    are the stage names (``prune``, ``prune#2`` if a stage repeats). Model stages first and
    exports last is this function's rule, and the only place it is written.
    """
    nodes = [Node("model", SOURCE_OP)]
    previous = "model"
    counts: dict[str, int] = {}

    def node_for(item: str | StageConfig, inputs: tuple[str, ...]) -> Node:
        op = item if isinstance(item, str) else item.stage
        counts[op] = counts.get(op, 0) + 1
        node_name = op if counts[op] == 1 else f"{op}#{counts[op]}"
        return Node(node_name, op, inputs, None if isinstance(item, str) else item)

    for item in model_stages:
        node = node_for(item, (previous,))
        nodes.append(node)
        previous = node.name
    nodes.append(Node("evaluate", EVALUATE_OP, (previous,)))
    for item in exports:
        node = node_for(item, (previous,))
        nodes.append(node)
        nodes.append(Node(f"evaluate.{node.name.removeprefix('export.')}", EVALUATE_OP, (node.name,)))
    return Pipeline(nodes, name=name)


def recipe_pipeline(configs: Iterable[StageConfig], name: str = "recipe") -> Pipeline:
    """The pipeline that replays a recipe: its model stages in order, then its exports."""
    configs = list(configs)
    model_stages = [c for c in configs if not is_export(c)]
    exports = [c for c in configs if is_export(c)]
    return chain_pipeline(model_stages, exports, name=name)


def load_pipeline(ref: str | Path) -> Pipeline:
    """``default``, a name in ``pipeline/defaults/pipelines/`` or a path to a pipeline YAML file."""
    if str(ref) == "default":
        return default_pipeline()
    path = pipeline_file(ref)
    return Pipeline.from_dict(read_yaml(path, "--pipeline"), name=path.stem)
