"""One reference pass per study (issue 46): the unoptimized model runs once over each evaluation batch, whoever reads
its outputs (the study's reference and self-check, the task spec's fidelity metrics, a proxy metric's cap, a fidelity
floor's rows, a fidelity spec's targets). An injected counter on every built model's forward counts the passes."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import Tensor, nn

from paretorch.pipeline.core.fidelity import PAIRWISE_RANK_CORRELATION, fidelity_spec
from paretorch.pipeline.core.fidelity_floor import with_fidelity_floor
from paretorch.pipeline.core.proxy_metric import with_proxy_metric
from paretorch.pipeline.core.self_check import SUBSET_SAMPLES, reference_outputs
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.core.unoptimized_outputs import UnoptimizedOutputs
from paretorch.pipeline.search import Search, SearchConfig, run_search
from tests.pipeline.core.test_fidelity_floor import MODEL, PAIRS, SENTENCES, encode

CPU = torch.device("cpu")


class Counted:
    """Builds copies of the toy model whose forwards record the id of each input batch they run."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.seen: list[int] = []

    def __call__(self) -> nn.Module:
        built = copy.deepcopy(self.model)
        built.register_forward_hook(self._record)
        return built

    def _record(self, _module: nn.Module, inputs: tuple[Tensor, ...], _output: Tensor) -> None:
        if not torch.is_autocast_enabled("cpu"):  # the noise floor's bf16 pass is a measurement of its own
            self.seen.append(id(inputs[0]))

    def passes_over(self, spec: ModelSpec) -> list[int]:
        """How often each evaluation batch ran, in evaluation order."""
        return [self.seen.count(id(batch[0])) for batch, _ in spec.evaluation()]


def minilm_like(counted: Counted) -> ModelSpec:
    """Composed as the MiniLM spec is: task data, a proxy metric over it, a fidelity floor on rows of its own."""
    base = ModelSpec(name="toy", build=counted, example_inputs=lambda n: encode(["cat"] * n), calibration=list,
                     evaluation=list, metric=PAIRWISE_RANK_CORRELATION, padding_mask=1, encode_text=encode,
                     output_kind="embedding")
    scored = with_proxy_metric(with_task_data(base, PAIRS))
    return with_fidelity_floor(scored, encode(SENTENCES), PAIRWISE_RANK_CORRELATION, "news_prc", 0.5, "toy")


def test_every_reader_shares_one_pass() -> None:
    counted = Counted(MODEL)
    spec = minilm_like(counted)
    model = load_model(spec)
    outputs, _targets = reference_outputs(model, spec, CPU)  # the study's reference: runs every batch, gives them
    assert counted.passes_over(spec) == [1, 1]
    metrics = (spec.metric, *spec.extra_metrics)
    values = {m.name: float(m.compute(outputs, torch.cat([t for _, t in spec.evaluation()])).item()) for m in metrics}
    assert values["news_prc"] == pytest.approx(1.0)  # the floor's reference is the same outputs
    assert counted.passes_over(spec) == [1, 1]  # the task spec's, the proxy's and the floor's readers ran nothing


def test_a_reader_first_then_the_study_reads_what_it_ran() -> None:
    counted = Counted(MODEL)
    spec = minilm_like(counted)
    shared = spec.unoptimized_outputs
    assert shared.of([batch for batch, _ in spec.evaluation()]).shape[0] == len(PAIRS.first) * 2 + len(SENTENCES)
    outputs, targets = reference_outputs(load_model(spec), spec, CPU)
    # The study's model runs the first batch once more: the check that it gives what the reader's copy gave.
    assert counted.passes_over(spec) == [2, 1] and outputs.shape[0] == targets.shape[0]


def test_a_build_that_makes_another_model_is_run_again() -> None:
    """A spec whose ``build`` draws new weights each call: the study's model is not the reader's; it runs itself."""
    spec = minilm_like(Counted(MODEL))
    spec.unoptimized_outputs.of([batch for batch, _ in spec.evaluation()])
    other = copy.deepcopy(MODEL)
    with torch.no_grad():
        other.embed.weight.mul_(-1.0)
    outputs, _targets = reference_outputs(other, spec, CPU)
    assert torch.allclose(outputs, torch.cat([other(*batch) for batch, _ in spec.evaluation()]).detach())


def test_a_derived_spec_with_another_model_gets_its_own() -> None:
    counted = Counted(MODEL)
    spec = minilm_like(counted)
    other = dataclasses.replace(spec, build=lambda: copy.deepcopy(MODEL))
    assert other.unoptimized_outputs is not spec.unoptimized_outputs
    assert dataclasses.replace(spec, name="again").unoptimized_outputs is spec.unoptimized_outputs


class Scorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


def test_a_search_runs_the_unoptimized_model_once_over_the_evaluation_set(tmp_path: Path) -> None:
    """A fidelity spec (the ``hf:`` and model-file path: its targets are the unoptimized outputs) searched to its
    first trial: each evaluation batch outside the self-check's subset ran once; those inside it three times (the
    reference, then the subset twice in the same batches; the third re-scoring re-cuts them into new batches), the
    first once more (the study's model checked against the targets' pass). The
    noise floor's one pass under bf16 autocast is not the unoptimized float32 model and is not counted."""
    counted = Counted(Scorer())
    data = torch.randn(640, 6, generator=torch.Generator().manual_seed(1))
    batches = [(data[i:i + 32],) for i in range(0, 640, 32)]
    spec = fidelity_spec("scorer", counted, lambda n: (data[:n],), lambda: batches[:2], lambda: batches,
                         output_kind="logits")
    config = SearchConfig.load(None, latency_budget="quick", exports="none", runtimes=("eager",), seeds=(),
                               presets=())
    search = Search(spec, CPU, config, storage=f"sqlite:///{tmp_path / 'optuna.db'}", track=False)
    with (tmp_path / "out.txt").open("w") as stream:
        run_search(search, 1, console=Console(file=stream, width=200))
    subset = SUBSET_SAMPLES // 32
    # The first batch once more: the study's model checked against the targets' pass before its outputs are read.
    assert counted.passes_over(spec) == [4] + [3] * (subset - 1) + [1] * (len(batches) - subset)


def test_provided_outputs_are_kept_on_the_cpu_and_not_replaced() -> None:
    shared = UnoptimizedOutputs(lambda: pytest.fail("built"))
    batch = (torch.ones(2, 3),)
    shared.provide(batch, torch.zeros(2, 4, dtype=torch.float16))
    shared.provide(batch, torch.ones(2, 4))
    assert shared.has([batch]) and not shared.has([(torch.ones(2, 3),)])
    known = shared.of([batch, batch])
    assert known.dtype == torch.float32 and known.shape == (4, 4) and float(known.abs().sum()) == 0.0
