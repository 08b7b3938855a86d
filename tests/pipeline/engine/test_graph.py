"""The pipeline DAG: construction checks, composition, YAML pipelines, recipes' chain pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.paths import PIPELINES_DIR
from paretorch.pipeline.engine.graph import Node, Pipeline, default_pipeline, load_pipeline, recipe_pipeline
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.stage import QuantizeConfig

#: The built-in stages of the default pipeline, in their places (a plugin's stage may sit anywhere among them).
BUILTIN_MODEL_STAGES = ["prune", "distill", "pack", "quantize", "amp"]
BUILTIN_EXPORTS = ["export.coreml", "export.onnx"]


def test_default_pipeline_shape(default_stages: tuple[list[str], list[str]]) -> None:
    model_stages, exports = default_stages  # from the registry: a plugin's stage is in them
    last = model_stages[-1]
    pipeline = default_pipeline()
    assert pipeline.describe() == " -> ".join(["model", *model_stages, "{" + ", ".join(exports) + "}"])
    assert [n.name for n in pipeline.model_stage_nodes()] == model_stages
    assert [n.name for n in pipeline.export_nodes()] == exports
    assert [name for name in model_stages if name in BUILTIN_MODEL_STAGES] == BUILTIN_MODEL_STAGES
    assert [name for name in exports if name in [*BUILTIN_EXPORTS, "export.pt2", "export.openvino"]] == BUILTIN_EXPORTS
    assert all(pipeline.node(name).inputs == (last,) for name in exports), "exports read the last model stage"
    assert pipeline.objective_node().name == "evaluate"
    assert pipeline.objective_node().inputs == (last,)
    evaluations = {f"evaluate.{name.removeprefix('export.')}" for name in exports}
    assert {n.name for n in pipeline.evaluation_nodes()} == {"evaluate", *evaluations}
    assert pipeline.downstream_of_exports() == {*exports, *evaluations}
    quantize = model_stages.index("quantize")
    assert pipeline.ancestors("quantize") == ["model", *model_stages[: quantize + 1]]
    assert [n for n in pipeline.ancestors("quantize") if n in BUILTIN_MODEL_STAGES] == ["prune", "distill", "pack",
                                                                                        "quantize"]


def test_cycle_is_rejected() -> None:
    with pytest.raises(ConfigError, match="has a cycle"):
        Pipeline([Node("model", "model"), Node("a", "prune", ("b",)), Node("b", "quantize", ("a",))])


def test_missing_input_is_rejected() -> None:
    with pytest.raises(ConfigError, match="node 'prune' reads 'nowhere', which no node produces"):
        Pipeline([Node("model", "model"), Node("prune", "prune", ("nowhere",))])


def test_duplicate_output_is_rejected() -> None:
    with pytest.raises(ConfigError, match="two nodes produce 'prune'"):
        Pipeline([Node("model", "model"), Node("prune", "prune", ("model",)), Node("prune", "quantize", ("model",))])


def test_unknown_stage_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown stage 'sparsify': known stages are .*prune"):
        Pipeline([Node("model", "model"), Node("s", "sparsify", ("model",))])


def test_exactly_one_source() -> None:
    with pytest.raises(ConfigError, match="exactly one 'model' node, found 0"):
        Pipeline([Node("evaluate", "evaluate", ())])


def test_stage_cannot_read_an_export() -> None:
    with pytest.raises(ConfigError, match=r"needs a model input; 'export\.onnx' is export"):
        Pipeline([Node("model", "model"), Node("export.onnx", "export.onnx", ("model",)),
                  Node("prune", "prune", ("export.onnx",))])


def test_fixed_config_must_match_the_op() -> None:
    with pytest.raises(ConfigError, match="a quantize config cannot configure op 'prune'"):
        Node("prune", "prune", ("model",), QuantizeConfig(method="int8_dynamic"))


def test_composition_merges_identical_nodes_and_rejects_conflicts() -> None:
    head = Pipeline([Node("model", "model"), Node("prune", "prune", ("model",))], name="head")
    tail = Pipeline([Node("model", "model"), Node("evaluate", "evaluate", ("model",))], name="tail")
    both = head + tail
    assert set(both.order) == {"model", "prune", "evaluate"}
    assert both.order[0] == "model"
    assert both.name == "head+tail"
    clash = Pipeline([Node("model", "model"), Node("prune", "quantize", ("model",))], name="clash")
    with pytest.raises(ConfigError, match="both define a different node 'prune'"):
        head + clash


def test_yaml_pipeline_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: small\n"
        "nodes:\n"
        "  - {op: model}\n"
        "  - {op: prune, config: {ratio: 0.5}}\n"
        "  - {op: quantize}\n"
        "  - {name: evaluate, op: evaluate}\n"
        "  - {op: export.onnx, inputs: [quantize]}\n"
    )
    pipeline = load_pipeline(path)
    assert pipeline.name == "small"
    assert pipeline.node("prune").config == PruneConfig(ratio=0.5)
    assert pipeline.node("quantize").inputs == ("prune",)  # defaults to the previous node
    assert pipeline.node("export.onnx").inputs == ("quantize",)
    again = Pipeline.from_dict(pipeline.to_dict())
    assert [n for n in again] == [n for n in pipeline]


def test_yaml_errors_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodes:\n  - {op: model}\n  - {op: prune, config: {ratio: 1.5}}\n")
    with pytest.raises(ConfigError, match=r"invalid prune config: ratio=1.5"):
        load_pipeline(path)
    with pytest.raises(ConfigError, match="pipeline 'nope' not found"):
        load_pipeline("nope")


def test_shipped_pipelines_load() -> None:
    files = sorted(PIPELINES_DIR.glob("*.yaml"))
    assert files, "pipeline/defaults/pipelines/ ships at least one example"
    for path in files:
        pipeline = load_pipeline(path.stem)
        assert pipeline.objective_node() is not None


def test_chain_pipeline_from_recipe_configs() -> None:
    configs = [PruneConfig(ratio=0.3), QuantizeConfig(method="int8_dynamic"), ONNXExportConfig(),
               PruneConfig(ratio=0.2)]
    pipeline = recipe_pipeline(configs)
    assert [n.name for n in pipeline.model_stage_nodes()] == ["prune", "quantize", "prune#2"]
    assert pipeline.node("export.onnx").inputs == ("prune#2",)
    assert pipeline.node("prune#2").config == PruneConfig(ratio=0.2)
