"""The prune stage on transformer encoders and mobile CNNs: FFN width and attention heads
pruned separately, depth pruning by measured block importance, depthwise convolutions.

The models are built here with random weights (a tiny BertModel from ``BertConfig``, a small
MobileNet-style CNN with inverted residual blocks); nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import optuna
import pytest
import torch
from torch import Tensor, nn
from transformers import BertConfig, BertModel

from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.evaluate import count_params
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply, config_from_dict
from paretorch.pipeline.sources.huggingface import PooledEmbedding
from paretorch.stages.prune.depth import candidate_blocks
from paretorch.stages.prune.stage import PruneConfig

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on the shared 2-core machine under load, two threads made the
    mobile CNN's small depthwise convolutions ~400x slower (2.3 s vs 5 ms per forward)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def unlabelled_spec(name: str, model: nn.Module, inputs: tuple[Tensor, ...]) -> ModelSpec:
    """A spec around a fixed model whose calibration batch is ``inputs``."""
    return ModelSpec(
        name=name,
        build=lambda: model,
        example_inputs=lambda batch: tuple(t[:batch] for t in inputs),
        calibration=lambda: [inputs],
        evaluation=lambda: [(inputs, torch.zeros(inputs[0].shape[0], dtype=torch.long))],
        metric=ACCURACY,
        latency_batch_sizes=(1,),
    )


def run(spec: ModelSpec, config: PruneConfig, model: nn.Module | None = None) -> tuple[Any, StageContext]:
    ctx = StageContext(spec=spec, device=CPU)
    return apply(model if model is not None else spec.build(), config, ctx), ctx


# --------------------------------------------------------------------------- tiny BERT


def tiny_bert() -> PooledEmbedding:
    """hidden 32, 4 layers, 4 heads, FFN 64, random weights, mean pooling."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return PooledEmbedding(BertModel(config)).eval()


@pytest.fixture(scope="module")
def bert_spec() -> ModelSpec:
    model = tiny_bert()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (8, 16), generator=generator)
    mask = torch.ones(8, 16, dtype=torch.long)
    mask[4:, 12:] = 0
    return unlabelled_spec("tiny_bert", model, (ids, mask))


def layers_of(model: Any) -> nn.ModuleList:
    return model.encoder.encoder.layer


def test_ffn_width_pruning_keeps_heads(bert_spec: ModelSpec) -> None:
    model = bert_spec.build()
    pruned, ctx = run(bert_spec, PruneConfig(ratio=0.5, head_ratio=0.0))
    for layer in layers_of(pruned):
        assert layer.intermediate.dense.out_features == layer.output.dense.in_features == 32
        assert layer.attention.self.query.out_features == 32
        assert layer.attention.self.num_attention_heads == 4
    assert pruned.encoder.config.intermediate_size == 32
    assert model.encoder.config.intermediate_size == 64  # the input model keeps its config
    assert set(ctx.records["prune.ffn_widths"].values()) == {32}
    assert "prune.attention_heads" not in ctx.records
    assert ctx.records["prune.params_after"] < ctx.records["prune.params_before"]
    inputs = bert_spec.example_inputs(8)
    assert pruned(*inputs).shape == model(*inputs).shape == (8, 32)


def test_head_pruning_keeps_ffn_width(bert_spec: ModelSpec) -> None:
    pruned, ctx = run(bert_spec, PruneConfig(ratio=0.5, ffn_ratio=0.0))
    for layer in layers_of(pruned):
        assert layer.intermediate.dense.out_features == 64
        assert layer.attention.self.num_attention_heads == 2
        assert layer.attention.self.query.out_features == 16  # 2 heads of 8
    assert pruned.encoder.config.intermediate_size == 64
    assert set(ctx.records["prune.attention_heads"].values()) == {2}
    assert pruned(*bert_spec.example_inputs(4)).shape == (4, 32)


def test_separate_head_and_ffn_ratios(bert_spec: ModelSpec) -> None:
    pruned, _ = run(bert_spec, PruneConfig(ratio=0.5, ffn_ratio=0.25))
    assert {layer.intermediate.dense.out_features for layer in layers_of(pruned)} == {48}
    assert {layer.attention.self.num_attention_heads for layer in layers_of(pruned)} == {2}
    assert pruned.encoder.config.intermediate_size == 48


def test_depth_removes_encoder_layers(bert_spec: ModelSpec) -> None:
    model = bert_spec.build()
    pruned, ctx = run(bert_spec, PruneConfig(method="depth", ratio=0.5))
    costs = ctx.records["prune.block_costs"]
    assert set(costs) == {f"encoder.encoder.layer.{i}" for i in range(4)}
    removed = ctx.records["prune.removed_blocks"]
    assert len(removed) == 2
    assert [r["block"] for r in removed] == sorted(costs, key=costs.get)[:2]
    assert all(r["cost"] == costs[r["block"]] > 0 for r in removed)
    assert len(layers_of(pruned)) == 2 and len(layers_of(model)) == 4
    assert pruned.encoder.config.num_hidden_layers == ctx.records["prune.num_hidden_layers"] == 2
    assert model.encoder.config.num_hidden_layers == 4
    assert count_params(pruned) < count_params(model)
    inputs = bert_spec.example_inputs(8)
    assert pruned(*inputs).shape == (8, 32)


def test_depth_removes_the_nearly_identity_layer_first(bert_spec: ModelSpec) -> None:
    model = tiny_bert()
    layer = layers_of(model)[1]
    with torch.no_grad():  # both residual branches add zero: the layer only re-applies LayerNorm
        for dense in (layer.attention.output.dense, layer.output.dense):
            dense.weight.zero_()
            dense.bias.zero_()
    pruned, ctx = run(bert_spec, PruneConfig(method="depth", ratio=0.25), model)
    costs = ctx.records["prune.block_costs"]
    assert [r["block"] for r in ctx.records["prune.removed_blocks"]] == ["encoder.encoder.layer.1"]
    assert costs["encoder.encoder.layer.1"] < 1e-3 * min(c for name, c in costs.items() if not name.endswith(".1"))
    assert len(layers_of(pruned)) == 3


def test_depth_iterative_steps_remeasure(bert_spec: ModelSpec) -> None:
    pruned, ctx = run(bert_spec, PruneConfig(method="depth", ratio=0.75, iterative_steps=3))
    removed = ctx.records["prune.removed_blocks"]
    assert [r["step"] for r in removed] == [1, 2, 3]
    assert len({r["block"] for r in removed}) == 3
    assert len(layers_of(pruned)) == 1


# --------------------------------------------------------------------------- mobile CNN


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // 4, 1)
        self.expand = nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        scale = x.mean(dim=(2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(torch.relu(self.reduce(scale))))


class InvertedResidual(nn.Module):
    """1x1 expand, 3x3 depthwise (groups = channels), optional squeeze-excitation, 1x1 project;
    a residual sum when stride 1 keeps the width."""

    def __init__(self, cin: int, cout: int, stride: int, se: bool, act: type[nn.Module]) -> None:
        super().__init__()
        hidden = 4 * cin
        layers: list[nn.Module] = [
            nn.Conv2d(cin, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            act(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            act(),
        ]
        if se:
            layers.append(SqueezeExcite(hidden))
        layers += [nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileCNN(nn.Module):
    """Stem, six inverted residual blocks (0, 2, 3, 5 residual; 1, 4 downsample), pooled head."""

    def __init__(self, se: bool = True, act: type[nn.Module] = nn.SiLU) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), act())
        widths = [(16, 16, 1), (16, 24, 2), (24, 24, 1), (24, 24, 1), (24, 32, 2), (32, 32, 1)]
        self.blocks = nn.Sequential(*(InvertedResidual(i, o, s, se, act) for i, o, s in widths))
        self.head = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def mobile_spec(se: bool = True, act: type[nn.Module] = nn.SiLU) -> ModelSpec:
    torch.manual_seed(0)
    model = MobileCNN(se, act)
    with torch.no_grad():  # non-trivial BatchNorm statistics, so that blocks differ
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.running_var.uniform_(0.5, 2.0)
    return unlabelled_spec(
        "mobile_cnn", model.eval(), (torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)
    )


@pytest.mark.parametrize(("se", "act"), [(True, nn.SiLU), (False, nn.ReLU6)])
def test_structured_prunes_depthwise_blocks_consistently(se: bool, act: type[nn.Module]) -> None:
    spec = mobile_spec(se, act)
    model = spec.build()
    pruned, ctx = run(spec, PruneConfig(ratio=0.5))
    assert ctx.records["prune.params_after"] < 0.5 * ctx.records["prune.params_before"]
    for block, original in zip(pruned.blocks, model.blocks, strict=True):
        expand, depthwise = block.block[0], block.block[3]
        # torch-pruning 1.6.1 couples a depthwise conv's input, output and groups to the expand conv's outputs.
        assert depthwise.groups == depthwise.in_channels == depthwise.out_channels == expand.out_channels
        assert expand.out_channels < original.block[0].out_channels
    inputs = spec.example_inputs(8)
    assert pruned(*inputs).shape == model(*inputs).shape == (8, 10)


class ChannelMultiplier(nn.Module):
    """A depthwise convolution that doubles its channels (groups = in_channels, out = 2 x in)."""

    def __init__(self, extra_block: bool) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 16, 3, padding=1, groups=8)
        self.extra = nn.Conv2d(16, 32, 1) if extra_block else nn.Identity()
        self.head = nn.Linear(32 if extra_block else 16, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.extra(torch.relu(self.depthwise(torch.relu(self.stem(x)))))).mean(dim=(2, 3)))


def test_channel_multiplier_conv_is_kept_whole_or_infeasible() -> None:
    inputs = (torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)
    model = ChannelMultiplier(extra_block=True).eval()
    pruned, ctx = run(unlabelled_spec("multiplier", model, inputs), PruneConfig(ratio=0.5))
    assert set(ctx.records["prune.kept_whole"]) == {"depthwise"}
    assert (pruned.stem.out_channels, pruned.depthwise.out_channels) == (8, 16)
    assert pruned.extra.out_channels == 16  # the one group that does not touch the multiplier conv
    assert pruned(*inputs).shape == (4, 10)
    alone = ChannelMultiplier(extra_block=False).eval()
    with pytest.raises(
        InfeasibleConfig, match=r"kept whole: depthwise \(depthwise convolution with a channel multiplier"
    ):
        run(unlabelled_spec("multiplier", alone, inputs), PruneConfig(ratio=0.5))


def test_depth_on_mobile_cnn_removes_residual_blocks_only() -> None:
    spec = mobile_spec()
    model = spec.build()
    pruned, ctx = run(spec, PruneConfig(method="depth", ratio=0.5))
    # The downsampling blocks and the squeeze-excitation modules (alone in their Sequential) are no candidates.
    assert set(ctx.records["prune.block_costs"]) == {"blocks.0", "blocks.2", "blocks.3", "blocks.5"}
    assert len(ctx.records["prune.removed_blocks"]) == 2
    assert len(pruned.blocks) == 4
    assert count_params(pruned) < count_params(model)
    assert pruned(*spec.example_inputs(8)).shape == (8, 10)


def test_depth_removes_the_zeroed_block_first() -> None:
    spec = mobile_spec()
    model = spec.build()
    with torch.no_grad():  # the last BatchNorm of block 3 outputs zeros: x + 0
        model.blocks[3].block[-1].weight.zero_()
        model.blocks[3].block[-1].bias.zero_()
    pruned, ctx = run(spec, PruneConfig(method="depth", ratio=0.25), model)
    assert len(pruned.blocks) == 5
    removed = ctx.records["prune.removed_blocks"]
    assert [r["block"] for r in removed] == ["blocks.3"]
    assert removed[0]["cost"] == 0.0
    assert all(cost > 0 for name, cost in ctx.records["prune.block_costs"].items() if name != "blocks.3")


def test_depth_without_candidates_is_infeasible(residual_spec: ModelSpec) -> None:
    with pytest.raises(InfeasibleConfig, match=r"depth pruning: the model has no removable block"):
        run(residual_spec, PruneConfig(method="depth", ratio=0.5))


class ScaledBlocks(nn.Module):
    """Residual blocks whose owner reads an attribute of each block: no block can be skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(2))
        for block in self.blocks:
            block.gain = 0.5  # type: ignore[assignment]

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = x + block(x) * block.gain
        return x


def test_blocks_the_model_cannot_skip_are_infeasible_with_the_reason() -> None:
    spec = unlabelled_spec("scaled", ScaledBlocks().eval(), (torch.randn(4, 8),))
    with pytest.raises(InfeasibleConfig, match=r"only 0 can be skipped \(blocks\.0: the forward pass fails .*gain"):
        run(spec, PruneConfig(method="depth", ratio=0.5))


def test_protected_block_is_no_candidate() -> None:
    spec = mobile_spec()
    model = spec.build()
    blocks = candidate_blocks(model, spec.example_inputs(2), [model.blocks[2].block[0]])
    assert [block.name for block in blocks] == ["blocks.0", "blocks.3", "blocks.5"]


# --------------------------------------------------------------------------- config and search space


def test_new_fields_round_trip_and_old_configs_load() -> None:
    for config in (PruneConfig(ratio=0.5, head_ratio=0.0, ffn_ratio=0.3), PruneConfig(method="depth", ratio=0.5)):
        assert config_from_dict(json.loads(json.dumps(config.to_dict()))) == config
    old = {"stage": "prune", "method": "structured", "ratio": 0.3, "importance": "l2", "scope": "uniform"}
    loaded = config_from_dict(old)
    assert isinstance(loaded, PruneConfig)
    assert loaded.head_ratio is None and loaded.ffn_ratio is None
    # Unset ratios stay out of the dict, so an old config keeps its cache key.
    assert "head_ratio" not in loaded.to_dict() and "ffn_ratio" not in loaded.to_dict()
    assert PruneConfig(ratio=0.3, ffn_ratio=0.0).to_dict()["ffn_ratio"] == 0.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"method": "unstructured", "head_ratio": 0.5}, r"head_ratio needs method='structured'"),
        ({"method": "depth", "ffn_ratio": 0.5}, r"ffn_ratio needs method='structured'"),
        ({"method": "depth", "importance": "taylor"}, r"importance='taylor'.*do not apply to method='depth'"),
        ({"method": "depth", "scope": "global"}, r"scope='global' do not apply to method='depth'"),
        ({"head_ratio": 0.95}, r"head_ratio=0\.95"),
        ({"ffn_ratio": -0.1}, r"ffn_ratio=-0\.1"),
    ],
)
def test_invalid_new_options_are_config_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"stage": "prune", "ratio": 0.5, **data})


def test_suggest_offers_depth_and_structures(bert_spec: ModelSpec) -> None:
    ctx = StageContext(spec=bert_spec, device=CPU)
    depth = {"prune.enabled": True, "prune.method": "depth", "prune.ratio": 0.5}
    assert PruneConfig.suggest(optuna.trial.FixedTrial(depth), ctx) == PruneConfig(method="depth", ratio=0.5)
    ffn = {
        **depth,
        "prune.method": "structured",
        "prune.importance": "l1",
        "prune.structure": "ffn",
        "prune.scope": "uniform",
    }
    expected = PruneConfig(ratio=0.5, importance="l1", head_ratio=0.0)
    assert PruneConfig.suggest(optuna.trial.FixedTrial(ffn), ctx) == expected
    heads = {**ffn, "prune.structure": "heads"}
    assert PruneConfig.suggest(optuna.trial.FixedTrial(heads), ctx) == PruneConfig(
        ratio=0.5, importance="l1", ffn_ratio=0.0
    )
