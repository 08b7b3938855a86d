"""A pack recipe's deployable callable round-trips through `pipeline apply` and a Pareto pack trial's folder: the
deploy/ folder holds weights in a form that runs no code on load (safetensors, or a weights-only state dict for
torchao's int8 tensors), the recipe and a manifest, and `load_deployment` rebuilds the encoder from them with the
saved weights.

A small BERT with random weights (built in the spec file below); nothing is downloaded.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from paretorch.pipeline.api import StageContext, load_deployment, run_chain
from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.engine.deployment import (
    MANIFEST,
    PICKLED_WEIGHTS,
    SAFE_WEIGHTS,
    rebuild_configs,
    save_deployment,
)
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.finish import export_trial
from paretorch.pipeline.sources.resolve import resolve_spec
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.pack.deploy import PackedEncoder
from paretorch.stages.pack.stage import PackConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.stage import QuantizeConfig
from tests.stages.test_pack import CPU, FP32_TOLERANCE, batch, max_diff, one_thread  # noqa: F401  (autouse)
from tests.stages.test_pack_deploy import token_lists

SPEC_SOURCE = '''
import torch
from transformers import BertConfig, BertModel
from paretorch.pipeline.core.fidelity import fidelity_spec
from paretorch.pipeline.sources.huggingface import PooledEmbedding

LENGTHS = torch.tensor([16, 12, 9, 3, 16, 5, 7, 11])
IDS = torch.randint(1, 100, (8, 16), generator=torch.Generator().manual_seed(0))
MASK = (torch.arange(16)[None, :] < LENGTHS[:, None]).long()


def build():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    return PooledEmbedding(BertModel(config), pooling="mean").eval()


def encode_text(texts):
    """A toy tokenizer: one id per character (1-99), [CLS]-like 1 first, padded to the longest text."""
    lists = [[1, *(2 + ord(c) % 97 for c in text[:15])] for text in texts]
    width = max(len(ids) for ids in lists)
    ids = torch.tensor([ids + [0] * (width - len(ids)) for ids in lists])
    return ids, (ids > 0).long()


def spec():
    return fidelity_spec("tiny_bert", build, lambda rows: (IDS[:rows] * MASK[:rows], MASK[:rows]),
                         lambda: [(IDS * MASK, MASK)], lambda: [(IDS * MASK, MASK)], latency_batch_sizes=(4,),
                         padding_mask=1, encode_text=encode_text)
'''


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_bert.py"
    path.write_text(SPEC_SOURCE)
    return path


def apply(spec_file: Path, stages: list[dict[str, object]], out: Path) -> int:
    recipe = out.parent / "recipe.json"
    recipe.write_text(json.dumps({"format": "paretorch-recipe/1", "model": "tiny_bert", "runtime": "eager",
                                  "stages": stages, "metadata": {}}))
    return main(["apply", "--recipe", str(recipe), "--model", f"{spec_file}:spec", "--device", "cpu",
                 "--results-dir", str(out.parent / "results"), "--output", str(out), "--no-export",
                 "--latency-budget", "quick", "--threads", "1", "--json"])


@pytest.mark.parametrize(("stages", "weights"), [
    ([{"stage": "pack"}], SAFE_WEIGHTS),
    ([{"stage": "pack"}, {"stage": "quantize", "method": "int8_dynamic"}], PICKLED_WEIGHTS),
    ([{"stage": "pack"}, {"stage": "amp", "dtype": "bfloat16", "fp32_layers": []}], SAFE_WEIGHTS),
], ids=["pack", "pack+int8", "pack+bf16"])
def test_apply_writes_what_load_deployment_rebuilds(spec_file: Path, tmp_path: Path, stages: list[dict[str, object]],
                                                   weights: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert apply(spec_file, stages, out) == 0
    summary = json.loads(capsys.readouterr().out)
    deploy = out / "deploy"
    assert summary["deployment"]["path"] == str(deploy) and summary["deployment"]["weights"] == weights
    assert sorted(p.name for p in deploy.iterdir()) == sorted([MANIFEST, "recipe.json", weights])
    spec = resolve_spec(f"{spec_file}:spec")
    encoder = load_deployment(deploy, spec, "cpu")
    assert isinstance(encoder, PackedEncoder) and encoder.runtime == "eager"
    ids, mask = batch([16, 1, 9, 4], seed=3)
    with torch.inference_mode():
        padded = spec.build()(ids, mask)
    replayed = PackedEncoder(run_chain(spec.build(), Recipe.load(deploy / "recipe.json").stages,
                                       StageContext(spec, CPU)).model, CPU)
    lists = token_lists(ids, mask)
    assert torch.equal(encoder(lists), replayed(lists)), "the saved weights are the applied model's"
    tolerance = FP32_TOLERANCE if len(stages) == 1 else 0.1 * float(padded.abs().max())
    assert max_diff(encoder(lists), padded) < tolerance


def test_a_deployment_encodes_strings_in_input_order(spec_file: Path, tmp_path: Path) -> None:
    """``encode(texts)``: the spec's tokenizer, the corpus sorted by length and batched, rows back in input order,
    each the row its text gets alone."""
    spec: ModelSpec = resolve_spec(f"{spec_file}:spec")
    recipe = Recipe((PackConfig(),), runtime="eager", model=spec.name)
    save_deployment(run_chain(spec.build(), recipe.stages, StageContext(spec, CPU)).model, recipe, tmp_path / "d")
    encoder = load_deployment(tmp_path / "d", spec)
    texts = ["a much longer sentence", "hi", "medium one", "x", "another long sentence here", "abc", "q"]
    alone = torch.cat([encoder.padded(*spec.encode_text([text])) for text in texts])  # type: ignore[misc]
    for batch_size in (1, 2, 3, 16):
        assert max_diff(encoder.encode(texts, batch_size=batch_size), alone) < FP32_TOLERANCE, batch_size
    assert max_diff(encoder.encode(texts, batch_size=2, sort=False, overlap=False), alone) < FP32_TOLERANCE


def test_the_saved_weights_not_the_replay_make_the_rebuilt_model(spec_file: Path, tmp_path: Path) -> None:
    spec: ModelSpec = resolve_spec(f"{spec_file}:spec")
    recipe = Recipe((PackConfig(),), runtime="eager", model=spec.name)
    model = run_chain(spec.build(), recipe.stages, StageContext(spec, CPU)).model
    tuned = copy.deepcopy(model)
    with torch.no_grad():  # what fine-tuning or distillation would do: values the replay cannot make
        for parameter in tuned.parameters():
            parameter.mul_(1.01)
    save_deployment(tuned, recipe, tmp_path / "deploy")
    ids, mask = batch([5, 16, 2], seed=1)
    lists = token_lists(ids, mask)
    loaded = load_deployment(tmp_path / "deploy", spec)(lists)
    assert torch.equal(loaded, PackedEncoder(tuned, CPU)(lists))
    assert max_diff(loaded, PackedEncoder(model, CPU)(lists)) > 1e-4


def test_a_rebuild_replays_structure_only() -> None:
    prune = PruneConfig(ratio=0.25, finetune_steps=100)
    chain = rebuild_configs([prune, DistillConfig(), PackConfig()])
    assert chain == [prune.model_copy(update={"finetune_steps": 0}), PackConfig()]


def test_bad_deployment_folders_say_what_to_give(spec_file: Path, tmp_path: Path) -> None:
    spec = resolve_spec(f"{spec_file}:spec")
    with pytest.raises(ConfigError, match=r"holds no deployment\.json"):
        load_deployment(tmp_path, spec)
    recipe = Recipe((PackConfig(),), runtime="eager", model="another_model")
    model = run_chain(spec.build(), recipe.stages, StageContext(spec, CPU)).model
    save_deployment(model, recipe, tmp_path / "deploy")
    with pytest.raises(ConfigError, match="not of 'tiny_bert'"):
        load_deployment(tmp_path / "deploy", spec)


def pareto_trial(spec: ModelSpec, recipe: Recipe, folder: Path) -> tuple[Any, Any, Recipe, dict[str, list[Path]],
                                                                          dict[str, str]]:
    """What finish_study runs for a Pareto trial of ``recipe`` into ``folder``: the study parts and trial record it
    read, and export_trial's final recipe, files and statuses."""
    runner = Runner(recipe_pipeline(recipe.stages), spec, CPU)
    parts: Any = SimpleNamespace(pipeline=runner.pipeline, runner=runner)
    record: Any = SimpleNamespace(recipe=recipe, configs={}, runtime=recipe.runtime, number=1)
    final, files, _, status = export_trial(parts, record, folder)
    return parts, record, final, files, status


def test_a_pareto_pack_trials_folder_holds_its_deployment(spec_file: Path, tmp_path: Path) -> None:
    spec = resolve_spec(f"{spec_file}:spec")
    recipe = Recipe((PackConfig(),), runtime="eager", model=spec.name)
    folder = tmp_path / "trial-001"
    _, _, final, files, status = pareto_trial(spec, recipe, folder)
    assert status == {"deploy": "ok"} and final.metadata["exports"] == status
    assert [path.name for path in files["deploy"]] == sorted([MANIFEST, "recipe.json", SAFE_WEIGHTS])
    ids, mask = batch([7, 16, 1], seed=4)
    lists = token_lists(ids, mask)
    expected = PackedEncoder(run_chain(spec.build(), recipe.stages, StageContext(spec, CPU)).model, CPU)(lists)
    assert torch.equal(load_deployment(folder / "deploy", spec)(lists), expected)


def test_a_pareto_trial_without_pack_deploys_its_model_under_its_runtime(spec_file: Path, tmp_path: Path) -> None:
    """Every front trial ships deploy/: a recipe without a deploying stage, the model under its runtime, host
    batches in (and strings through encode), host float32 out, as the replayed recipe computes them."""
    spec = resolve_spec(f"{spec_file}:spec")
    recipe = Recipe((QuantizeConfig(method="int8_dynamic"),), runtime="eager", model=spec.name)
    _, _, final, files, status = pareto_trial(spec, recipe, tmp_path / "trial-002")
    assert status == {"deploy": "ok"} and final.metadata["exports"] == status
    assert [path.name for path in files["deploy"]] == sorted([MANIFEST, "recipe.json", PICKLED_WEIGHTS])
    assert json.loads((tmp_path / "trial-002" / "deploy" / MANIFEST).read_text())["callable"] == "model"
    loaded = load_deployment(tmp_path / "trial-002" / "deploy", spec)
    ids, mask = batch([7, 16, 1], seed=4)
    with torch.inference_mode():
        expected = run_chain(spec.build(), recipe.stages, StageContext(spec, CPU)).model(ids, mask).float()
    torch.testing.assert_close(loaded(ids, mask), expected)
    texts = ["a longer sentence", "short", "mid length"]
    torch.testing.assert_close(loaded.encode(texts, batch_size=2), loaded(*spec.encode_text(texts)))
