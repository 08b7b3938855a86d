"""A pack recipe under a runtime that runs a file (onnxruntime, openvino): the file keeps the padded graph and the
runtime calls it once per length group of rows; the search measures that call, `pipeline apply` ships the file in
deploy/ and `load_deployment` opens it behind the token-list contract. A runtime that declares nothing of the kind
(MLX) refuses the recipe before it runs.

The small BERT of tests/stages/test_pack_apply.py (random weights, made here); nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paretorch.pipeline.api import load_deployment
from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.length_groups import GroupedEncoder
from paretorch.pipeline.core.runtimes.registry import get_runtime, registered_runtimes
from paretorch.pipeline.core.stage import ExportResult, export_mirror
from paretorch.pipeline.engine.deployment import MANIFEST, SAFE_WEIGHTS, save_deployment
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.sources.resolve import resolve_spec
from paretorch.stages.common.mirror_facts import PaddingFree
from paretorch.stages.pack.stage import PackConfig
from tests.stages.test_pack import batch, max_diff, one_thread  # noqa: F401  (autouse)
from tests.stages.test_pack_apply import SPEC_SOURCE, pareto_trial
from tests.stages.test_pack_deploy import token_lists

#: The file each runtime deploys (under ``--output``, named after the spec).
FILES = {"onnxruntime": "tiny_bert.onnx", "openvino": "tiny_bert.openvino"}


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_bert.py"
    path.write_text(SPEC_SOURCE)
    return path


def apply(spec_file: Path, runtime: str, stages: list[dict[str, object]], out: Path) -> int:
    recipe = out.parent / f"recipe-{runtime}.json"
    recipe.write_text(json.dumps({"format": "paretorch-recipe/1", "model": "tiny_bert", "runtime": runtime,
                                  "stages": stages, "metadata": {}}))
    return main(["apply", "--recipe", str(recipe), "--model", f"{spec_file}:spec", "--device", "cpu",
                 "--results-dir", str(out.parent / "results"), "--output", str(out), "--latency-budget", "quick",
                 "--threads", "1", "--json"])


def test_file_runtimes_reproduce_pack_as_grouped_calls_and_mlx_refuses_it() -> None:
    mirror = export_mirror([PackConfig()])
    assert mirror.of(PaddingFree) is not None and not mirror.not_mirrored
    for name in ("onnxruntime", "openvino", "eager", "compile"):
        assert get_runtime(name).cannot_run(mirror, scripted=False) is None, name
    if "mlx" not in registered_runtimes():
        pytest.skip("the MLX plugin is not installed here (no MLX wheel for this platform)")
    refusal = get_runtime("mlx").cannot_run(mirror, scripted=False)
    assert refusal is not None and "pack (padding-free execution)" in refusal


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_apply_measures_the_grouped_call_and_deploys_the_file(spec_file: Path, tmp_path: Path, runtime: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert apply(spec_file, runtime, [{"stage": "pack"}], out) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "called per length group" in summary["device"], "the search and apply time the grouped call"
    deploy = out / "deploy"
    assert summary["deployment"]["file"] == FILES[runtime] and "weights" not in summary["deployment"]
    assert sorted(p.name for p in deploy.iterdir()) == sorted([MANIFEST, "recipe.json", FILES[runtime]])
    manifest = json.loads((deploy / MANIFEST).read_text())
    assert manifest["grouped_mask_input"] == 1 and manifest["max_length"] == 32
    spec = resolve_spec(f"{spec_file}:spec")
    encoder = load_deployment(deploy, spec)
    assert isinstance(encoder, GroupedEncoder) and encoder.max_length == 32
    ids, mask = batch([16, 1, 9, 4, 12, 2, 16, 7, 3, 11], seed=3)
    with torch.inference_mode():
        padded = spec.build()(ids, mask)
    lists = token_lists(ids, mask)
    assert max_diff(encoder(lists), padded) < 1e-4 * max(1.0, float(padded.abs().max()))
    assert torch.equal(encoder(lists), encoder.padded(ids, mask))
    with pytest.raises(ConfigError, match="load it without runtime="):
        load_deployment(deploy, spec, runtime="eager")
    # the same folder written again for a torch runtime holds that deployment only (the file is gone)
    assert apply(spec_file, "eager", [{"stage": "pack"}], out) == 0
    assert sorted(p.name for p in deploy.iterdir()) == sorted([MANIFEST, "recipe.json", SAFE_WEIGHTS])


def test_int8_pack_under_onnxruntime_groups_and_a_broken_folder_says_what_to_do(
        spec_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    stages: list[dict[str, object]] = [{"stage": "pack"}, {"stage": "quantize", "method": "int8_dynamic",
                                                            "min_weight_elements": 0}]
    assert apply(spec_file, "onnxruntime", stages, out) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "called per length group" in summary["device"]
    deploy = out / "deploy"
    (deploy / FILES["onnxruntime"]).unlink()
    with pytest.raises(ConfigError, match=r"is missing .* write the folder again"):
        load_deployment(deploy, resolve_spec(f"{spec_file}:spec"))
    assert not (deploy / SAFE_WEIGHTS).exists()


def test_a_pareto_pack_trial_under_onnxruntime_ships_the_file_it_ran(spec_file: Path, tmp_path: Path) -> None:
    spec = resolve_spec(f"{spec_file}:spec")
    recipe = Recipe((PackConfig(),), runtime="onnxruntime", model=spec.name)
    folder = tmp_path / "trial-001"
    *_, files, status = pareto_trial(spec, recipe, folder)
    assert status["deploy"] == "ok"
    assert [path.name for path in files["deploy"]] == sorted([MANIFEST, "recipe.json", FILES["onnxruntime"]])
    encoder = load_deployment(folder / "deploy", spec)
    ids, mask = batch([7, 16, 1, 12, 3, 9, 16, 2, 5], seed=4)
    with torch.inference_mode():
        padded = spec.build()(ids, mask)
    assert isinstance(encoder, GroupedEncoder)
    assert max_diff(encoder(token_lists(ids, mask)), padded) < 1e-4 * max(1.0, float(padded.abs().max()))


def test_a_file_without_a_padding_mask_to_group_by_is_not_deployed_as_packed(tmp_path: Path) -> None:
    recipe = Recipe((PackConfig(),), runtime="onnxruntime", model="digits")
    padded_file = ExportResult(format="onnx", path=tmp_path / "digits.onnx", size_bytes=0, validation="")
    with pytest.raises(ConfigError, match=r"digits has no padding mask .* drop pack from the recipe"):
        save_deployment(torch.nn.Linear(1, 1), recipe, tmp_path / "deploy", padded_file)
