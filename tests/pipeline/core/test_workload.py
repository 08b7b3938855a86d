"""The workload the search times (paretorch.pipeline.core.workload): raw inputs to host outputs, tokenization inside the
timed call, a serve stream in the given order, a corpus sorted and returned in input order, a static-shape runtime's
buckets, and one clear error for an unknown workload."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.latency import LATENCY_BUDGETS, latency_stats
from paretorch.pipeline.core.padding import BUCKETS
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_metrics import classification_metrics
from paretorch.pipeline.core.text_batches import to_host
from paretorch.pipeline.core.workload import SERVE_BATCHES, Workload, workload_for
from paretorch.pipeline.search.objectives import Objectives
from paretorch.pipeline.search.study_latency import StudyLatency

CPU = torch.device("cpu")
TEXTS = [f"sentence number {i} " + "word " * (i % 7) for i in range(40)]


def char_tokens(texts: Sequence[str], delay: float = 0.0) -> tuple[Tensor, Tensor]:
    """Character ids padded to the longest text, as a fast tokenizer's batch call pads."""
    time.sleep(delay)
    width = max(len(t) for t in texts)
    ids = torch.tensor([[1 + ord(c) % 100 for c in t] + [0] * (width - len(t)) for t in texts])
    return ids, (ids > 0).long()


class BagOfChars(nn.Module):
    """(input_ids, attention_mask) -> (batch, 2): the row's token count and id sum (a text's own numbers)."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        self.widths.append(int(input_ids.shape[1]))
        return torch.stack([attention_mask.sum(1), (input_ids * attention_mask).sum(1)], dim=1).to(torch.float16)


def own_rows(texts: Sequence[str]) -> Tensor:
    return torch.cat([BagOfChars()(*char_tokens([t])).float() for t in texts])


def text_spec(delay: float = 0.0) -> ModelSpec:
    return ModelSpec(name="chars", build=lambda: BagOfChars().eval(),
                     example_inputs=lambda n: char_tokens((TEXTS * n)[:n]), calibration=list, evaluation=list,
                     metric=None,  # type: ignore[arg-type]  # not evaluated here
                     padding_mask=1, encode_text=lambda texts: char_tokens(texts, delay),
                     latency_texts=lambda: TEXTS)


def test_serve_runs_its_batches_in_the_given_order_from_strings_to_host_float32() -> None:
    workload = workload_for("serve", text_spec(), 4)
    assert workload is not None and workload.texts
    assert workload.texts == tuple(TEXTS[: SERVE_BATCHES * 4]) and workload.batches == SERVE_BATCHES
    model = BagOfChars()
    out = workload.timed(model, CPU, text_spec().encode_text, static_shapes=False)()
    assert out.dtype == torch.float32 and out.device.type == "cpu"
    torch.testing.assert_close(out, own_rows(workload.texts))
    assert len(model.widths) == SERVE_BATCHES  # one call per batch, each padded to its own longest text
    assert model.widths == [max(len(t) for t in workload.texts[i : i + 4]) for i in range(0, 16, 4)]


def test_serve_repeats_a_short_text_list_to_fill_its_batches() -> None:
    spec = text_spec()
    short = dataclasses.replace(spec, latency_texts=lambda: TEXTS[:3])
    workload = workload_for("serve", short, 4)
    assert workload is not None and workload.texts == tuple((TEXTS[:3] * 6)[: SERVE_BATCHES * 4])


def test_a_corpus_is_sorted_into_batches_and_comes_back_in_input_order() -> None:
    workload = workload_for("corpus", text_spec(), 8)
    assert workload is not None and workload.texts == tuple(TEXTS) and workload.batches == 5
    model = BagOfChars()
    out = workload.timed(model, CPU, text_spec().encode_text, static_shapes=False)()
    torch.testing.assert_close(out, own_rows(TEXTS))
    assert model.widths == sorted(model.widths, reverse=True)  # longest first: each batch pads little


def test_a_static_shape_runtime_gets_its_length_bucket() -> None:
    model = BagOfChars()
    workload = Workload("serve", 4, texts=tuple(TEXTS[:8]))
    out = workload.timed(model, CPU, char_tokens, static_shapes=True)()
    torch.testing.assert_close(out, own_rows(TEXTS[:8]))  # padding the bucket adds is masked out
    assert model.widths and all(width in BUCKETS for width in model.widths)


def test_tokenization_is_inside_the_timed_call() -> None:
    """An injected slow tokenizer raises the latency the search measures (per batch, by the delay at least); the
    model-call workload does not see it."""
    delay = 0.02
    timings = {}
    for name, spec in (("fast", text_spec()), ("slow", text_spec(delay))):
        latency = StudyLatency(spec, CPU, 4, lambda: None, LATENCY_BUDGETS["quick"],  # type: ignore[arg-type,return-value]
                               workload_for("serve", spec, 4))
        latency._baseline = BagOfChars()
        timings[name] = latency.baseline_alone().p50_ms
    assert timings["slow"] >= timings["fast"] + 1000 * delay * 0.95
    model_only = StudyLatency(text_spec(delay), CPU, 4, lambda: None, LATENCY_BUDGETS["quick"])  # type: ignore[arg-type,return-value]
    fn, inputs = model_only.timed(BagOfChars(), "eager")
    assert fn(*inputs).shape == (4, 2)  # the device batch itself: no tokenizer in the call


def test_a_model_given_as_tensors_is_served_from_host_tensors() -> None:
    spec = ModelSpec(name="tensors", build=lambda: nn.Linear(3, 2), example_inputs=lambda n: (torch.randn(n, 3),),
                     calibration=list, evaluation=list, metric=None)  # type: ignore[arg-type]
    workload = workload_for("serve", spec, 8)
    assert workload is not None and not workload.texts and workload.items == SERVE_BATCHES * 8
    model = nn.Linear(3, 2).to(torch.float64)
    out = workload.timed(lambda x: model(x.double()), CPU, None, static_shapes=False)()
    assert out.shape == (SERVE_BATCHES * 8, 2) and out.dtype == torch.float32
    assert workload_for("model", spec, 8) is None  # the model call alone: the device batch, as before


def test_unknown_workload_and_a_non_tensor_output_say_what_to_do() -> None:
    with pytest.raises(ConfigError, match="--workload stream: choose one of serve, corpus, model"):
        workload_for("stream", text_spec(), 4)
    with pytest.raises(TypeError, match="returned dict, not a tensor"):
        to_host({"a": 1})


def test_the_model_call_is_a_figure_beside_a_workload_and_none_of_its_own_without_one() -> None:
    """On a workload the baseline keeps both figures and a trial gets its model call's speed-up beside the workload's;
    on ``--workload model`` the two are one (no second figure, no 'model call' column)."""
    spec = dataclasses.replace(text_spec(), metric=classification_metrics(2)[0])
    objectives = Objectives.create(spec, ("metric", "latency"), "1%", latency_batch=4)

    def report(model_ms: float) -> ModelReport:
        return ModelReport("accuracy", 0.9, {4: latency_stats([model_ms] * 5, 4, 0.0)}, 0, 100, 10, None, "eager",
                           0.0, "cpu")

    served = objectives.baseline_from(report(8.0), workload_ms=12.0)
    assert (served.latency_ms, served.model_call_ms) == (12.0, 8.0)
    trial = objectives.trial_metrics(report(2.0), served)
    assert trial["model_call_speedup"] == pytest.approx(4.0)
    alone = objectives.baseline_from(report(8.0))
    assert (alone.latency_ms, alone.model_call_ms) == (8.0, None)
    assert "model_call_speedup" not in objectives.trial_metrics(report(2.0), alone)
