"""Model sources: TorchScript files, .pt2 programs, local Hugging Face directories, and their bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.evaluate import LatencySettings, compute_metric, evaluate_model
from paretorch.pipeline.core.fidelity import MEAN_COSINE, TOP1_AGREEMENT
from paretorch.pipeline.core.spec import load_model
from paretorch.pipeline.sources import SourceOptions, layer_access_problem, source_kind
from paretorch.pipeline.sources.inputs import MIN_EVALUATION_SAMPLES, parse_input_shape
from paretorch.pipeline.sources.resolve import resolve_spec

CPU = torch.device("cpu")
FAST = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0)
SHAPE = "1x3x8x8"


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class TinyEmbedder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.proj(x), dim=1)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model and input files of every kind, good and bad."""
    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(0)
    cnn, embedder = TinyCNN().eval(), TinyEmbedder().eval()
    example = torch.randn(2, 3, 8, 8)
    paths = {name: root / name for name in (
        "scripted.pt", "traced.ts", "embedder.pt", "dynamic.pt2", "static.pt2", "state_dict.pt",
        "garbage.pt", "script_named.pt2", "program_named.pt", "inputs.pt", "inputs_dict.pt", "lines.txt",
        "empty.txt", "no_config",
    )}
    torch.jit.script(cnn).save(str(paths["scripted.pt"]))
    torch.jit.trace(cnn, (example,)).save(str(paths["traced.ts"]))
    torch.jit.trace(embedder, (torch.randn(2, 12),)).save(str(paths["embedder.pt"]))
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(cnn, (example,), dynamic_shapes=({0: batch},)), str(paths["dynamic.pt2"]))
    torch.export.save(torch.export.export(cnn, (example,)), str(paths["static.pt2"]))
    torch.save(cnn.state_dict(), paths["state_dict.pt"])
    paths["garbage.pt"].write_text("not a model")
    paths["script_named.pt2"].write_bytes(paths["scripted.pt"].read_bytes())
    paths["program_named.pt"].write_bytes(paths["dynamic.pt2"].read_bytes())
    torch.save(torch.randn(20, 3, 8, 8), paths["inputs.pt"])
    torch.save({"x": torch.randn(2, 3, 8, 8)}, paths["inputs_dict.pt"])
    paths["lines.txt"].write_text(
        "\n".join(
            [
                "The cat sat on the mat.",
                "Lists are mutable sequences of objects.",
                "A dictionary maps keys to values.",
                "",
                "Tuples cannot be changed once made.",
                "Sets keep only distinct elements.",
                "A dictionary maps keys to values.",
                "Functions return a value or None.",
            ]
        )
    )
    paths["empty.txt"].write_text("\n  \n")
    paths["no_config"].mkdir()
    return paths


def _resolve(path: Path, **options: str) -> object:
    return resolve_spec(str(path), SourceOptions(**options))


# --------------------------------------------------------------------------- good sources


@pytest.mark.parametrize("name", ["scripted.pt", "traced.ts", "dynamic.pt2"])
def test_file_sources_resolve_to_fidelity_specs_of_one(files: dict[str, Path], name: str) -> None:
    spec = _resolve(files[name], input_shape=SHAPE)
    assert spec.metric is TOP1_AGREEMENT  # (batch, 5) logits
    assert spec.source == str(files[name])
    model = load_model(spec)
    assert spec.example_inputs(7)[0].shape == (7, 3, 8, 8)
    evaluation = spec.evaluation()
    assert sum(len(inputs[0]) for inputs, _ in evaluation) == MIN_EVALUATION_SAMPLES
    assert compute_metric(model, evaluation, spec.metric, CPU) == 1.0
    calibration = torch.cat([batch[0] for batch in spec.calibration()])
    assert not torch.equal(calibration[:4], torch.cat([i[0] for i, _ in evaluation])[:4])


def test_torchscript_spec_evaluates_and_damage_lowers_fidelity(files: dict[str, Path]) -> None:
    spec = _resolve(files["scripted.pt"], input_shape=SHAPE)
    model = load_model(spec)
    report = evaluate_model(model, spec, CPU, settings=FAST, batch_sizes=(1, 4))
    assert report.metric_name == "top1_agreement" and report.metric_value == 1.0
    assert set(report.latency) == {1, 4} and report.params == sum(p.numel() for p in model.parameters())
    damaged = load_model(spec)
    with torch.no_grad():
        damaged.head.weight.mul_(-1.0)
        damaged.head.bias.mul_(-1.0)
    assert compute_metric(damaged, spec.evaluation(), spec.metric, CPU) < 0.5


def test_embedding_output_is_measured_by_cosine(files: dict[str, Path]) -> None:
    spec = _resolve(files["embedder.pt"], input_shape="4x12")
    assert spec.metric is MEAN_COSINE  # unit-norm rows: not logits
    assert compute_metric(load_model(spec), spec.evaluation(), spec.metric, CPU) == pytest.approx(1.0, abs=1e-6)
    forced = _resolve(files["scripted.pt"], input_shape=SHAPE, output_kind="embedding")
    assert forced.metric is MEAN_COSINE


def test_inputs_file_samples_are_evaluated_first(files: dict[str, Path]) -> None:
    spec = _resolve(files["dynamic.pt2"], inputs_file=str(files["inputs.pt"]))
    samples = torch.load(files["inputs.pt"])
    first = spec.evaluation()[0][0][0]
    assert torch.equal(first[:20], samples)
    assert torch.equal(spec.example_inputs(3)[0], samples[:3])
    assert compute_metric(load_model(spec), spec.evaluation(), spec.metric, CPU) == 1.0


def test_input_shape_parsing() -> None:
    two = parse_input_shape(" 1x3x224x224 , 1X10 ")
    assert [t.sample_shape for t in two] == [(3, 224, 224), (10,)]
    assert parse_input_shape("16")[0].sample_shape == ()


def test_hf_directory_with_text_inputs(files: dict[str, Path], minilm_dir: Path) -> None:
    spec = resolve_spec(f"hf:{minilm_dir}", SourceOptions(inputs_file=str(files["lines.txt"])))
    assert spec.metric is MEAN_COSINE
    model = load_model(spec)
    input_ids, attention_mask = spec.example_inputs(2)
    assert input_ids.dtype == torch.int64 and input_ids.shape == (2, 128)
    output = model(input_ids, attention_mask)
    assert output.shape == (2, 384)
    assert torch.allclose(output.norm(dim=1), torch.ones(2), atol=1e-5)  # modules.json lists Normalize
    evaluation = spec.evaluation()
    assert sum(len(inputs[0]) for inputs, _ in evaluation) == 5  # 6 distinct lines, 1 for calibration
    assert compute_metric(model, evaluation, spec.metric, CPU) == pytest.approx(1.0, abs=1e-6)


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    from paretorch.experiments.models.minilm import model_dir

    return model_dir()


def test_layer_access_problem_names_the_model_kind(files: dict[str, Path]) -> None:
    scripted = load_model(_resolve(files["scripted.pt"], input_shape=SHAPE))
    program = load_model(_resolve(files["dynamic.pt2"], input_shape=SHAPE))
    assert "TorchScript" in (layer_access_problem(scripted) or "")
    assert "torch.export program" in (layer_access_problem(program) or "")
    assert layer_access_problem(TinyCNN()) is None


def test_source_kind_routing() -> None:
    assert source_kind("hf:some/dir") == "hf"
    assert source_kind("model.PT2") == "pt2"
    assert source_kind("weights.pth") == "torchscript"
    assert source_kind("models/net.pt:spec") is None  # a Python attribute reference
    assert source_kind("digits") is None


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("missing.pt", {"input_shape": SHAPE}, r"model file not found: .*missing\.pt"),
        ("missing.pt2", {"input_shape": SHAPE}, r"model file not found"),
        ("state_dict.pt", {"input_shape": SHAPE}, r"torch\.save'd object .* not a TorchScript program: save the model"),
        ("garbage.pt", {"input_shape": SHAPE}, r"not a torch archive \(not a zip file\)"),
        ("script_named.pt2", {"input_shape": SHAPE}, r"is a TorchScript archive, not a torch\.export program: rename"),
        ("program_named.pt", {"input_shape": SHAPE}, r"is a torch\.export \(\.pt2\) archive, not TorchScript: rename"),
        ("scripted.pt", {}, r"carries no input data: pass --input-shape .* --inputs-file .* or --eval-data"),
        ("dynamic.pt2", {}, r"carries no input data: pass --input-shape"),
        ("scripted.pt", {"input_shape": "1x3xeightx8"}, r"bad --input-shape '1x3xeightx8'.*e\.g\. 1x3x224x224"),
        ("scripted.pt", {"input_shape": "1x0x8"}, r"bad --input-shape"),
        ("scripted.pt", {"input_shape": " "}, r"--input-shape is empty"),
        ("scripted.pt", {"input_shape": "1x5x8x8"}, r"forward on a batch of shape 2x5x8x8 failed .*channels"),
        ("static.pt2", {"input_shape": SHAPE}, r"Guard failed.*needs a dynamic batch dimension"),
        ("scripted.pt", {"input_shape": SHAPE, "inputs_file": "x.pt"}, r"either --input-shape or --inputs-file"),
        ("scripted.pt", {"inputs_file": "nowhere.pt"}, r"inputs file not found: .*nowhere\.pt"),
        ("scripted.pt", {"inputs_file": "inputs_dict.pt"}, r"holds a dict, not a tensor or a tuple/list"),
        ("scripted.pt", {"inputs_file": "lines.txt"}, r"is not a torch\.save file"),
        ("scripted.pt", {"input_shape": SHAPE, "output_kind": "scores"}, r"unknown --output-kind 'scores'"),
    ],
)
def test_bad_file_sources_give_one_line_errors(
    files: dict[str, Path], name: str, options: dict[str, str], message: str
) -> None:
    if "inputs_file" in options and options["inputs_file"] in files:
        options = {**options, "inputs_file": str(files[options["inputs_file"]])}
    path = files.get(name, files["scripted.pt"].parent / name)
    with pytest.raises(SpecError, match=message) as caught:
        _resolve(path, **options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("ref", "options", "message"),
    [
        ("hf:{root}/no_config", {"inputs_file": "lines.txt"}, r"has no config\.json: point hf: at the directory"),
        ("hf:{root}/absent", {"inputs_file": "lines.txt"}, r"hf: directory not found"),
        ("hf:{minilm}", {}, r"needs --inputs-file \(a UTF-8 text file"),
        ("hf:{minilm}", {"inputs_file": "empty.txt"}, r"has 0 distinct non-empty line\(s\): give at least 2"),
        ("hf:{minilm}", {"inputs_file": "lines.txt", "input_shape": "1x3"}, r"--input-shape does not apply to hf:"),
        ("digits", {"input_shape": "1x3"}, r"--input-shape: only for TorchScript .* not for 'digits'"),
    ],
)
def test_bad_hf_sources_and_misplaced_options(
    files: dict[str, Path], minilm_dir: Path, ref: str, options: dict[str, str], message: str
) -> None:
    ref = ref.format(root=files["lines.txt"].parent, minilm=minilm_dir)
    if "inputs_file" in options:
        options = {**options, "inputs_file": str(files[options["inputs_file"]])}
    with pytest.raises(SpecError, match=message) as caught:
        resolve_spec(ref, SourceOptions(**options))
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- CLI


def test_cli_evaluates_a_torchscript_file(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["evaluate", "--model", str(files["traced.ts"]), "--input-shape", SHAPE, "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metric_name"] == "top1_agreement" and report["metric_value"] == 1.0


def test_cli_reports_a_bad_source_on_one_line(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["evaluate", "--model", str(files["dynamic.pt2"])])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: .pt2 file") and "--input-shape" in err and "\n" not in err
