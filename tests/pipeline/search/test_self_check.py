"""The unoptimized model is scored again on a subset, twice and re-batched, before any trial: a metric that moves
stops the run, with its cause (state or the batch size).

The toy model keeps a running state between calls and resets it when the batch size changes, like a
streaming voice-activity TorchScript model: load_model's batch-2 forward and a new batch size leave
the first pass identical to the reference, so only a second pass shows the state.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from paretorch.pipeline.cli.main import EXIT_USER_ERROR, main
from paretorch.pipeline.core import progress
from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.fidelity import MEAN_ABS_ERROR, OUTPUT_R2, R2_FLOOR, default_fidelity_metrics, output_r2
from paretorch.pipeline.core.progress import say
from paretorch.pipeline.core.self_check import SUBSET_SAMPLES, reference_outputs, require_stable, self_check
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.core.task_data import PairsData
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.store import ATTR_SELF_CHECK
from paretorch.pipeline.sources.resolve import resolve_spec
from tests.pipeline.core.test_fidelity_floor import MODEL, encode

CPU = torch.device("cpu")

SPEC_SOURCE = '''
import torch
from torch import nn

from paretorch.pipeline.core.fidelity import fidelity_spec

DATA = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))


class StreamingScorer(nn.Module):
    """One score per sample from a state kept between calls; a new batch size starts a new state."""

    def __init__(self, stateful: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.linspace(-1.0, 1.0, 8)[None])
            self.linear.bias.zero_()
        self.stateful = stateful
        self.state = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.stateful or self.state is None or self.state.shape[0] != x.shape[0]:
            self.state = torch.zeros(x.shape[0], 1, device=x.device)
        score = torch.sigmoid(self.linear(x) + self.state)
        self.state = 0.9 * self.state + score.detach()
        return score


def make(stateful: bool):
    return fidelity_spec(
        "streaming" if stateful else "stateless", lambda: StreamingScorer(stateful), lambda b: (DATA[:b],),
        lambda: [(DATA[:32],)], lambda: [(DATA[40 + i : 72 + i],) for i in range(0, 160, 32)],
        latency_batch_sizes=(4,),
    )


def spec():
    return make(True)


def stateless():
    return make(False)


class BatchCentred(nn.Module):
    """Stateless, but each row minus its batch's mean: the outputs depend on how the inputs are cut."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(dim=0, keepdim=True)).sum(dim=1, keepdim=True)


LARGE = torch.randn(1280, 8, generator=torch.Generator().manual_seed(1))


def batch_centred():
    return fidelity_spec("centred", BatchCentred, lambda b: (DATA[:b],), lambda: [(DATA[:32],)],
                         lambda: [(DATA[i : i + 32],) for i in range(0, 160, 32)], latency_batch_sizes=(4,))


def large():
    return fidelity_spec("large", lambda: StreamingScorer(False), lambda b: (LARGE[:b],), lambda: [(LARGE[:32],)],
                         lambda: [(LARGE[i : i + 32],) for i in range(0, 1280, 32)], latency_batch_sizes=(4,))
'''


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "streaming.py"
    path.write_text(SPEC_SOURCE)
    return path


def _spec(spec_file: Path, attr: str = "spec") -> ModelSpec:
    return resolve_spec(f"{spec_file}:{attr}")


def _search(spec: ModelSpec, tmp_path: Path, allow_nondeterministic: bool = False) -> Search:
    config = SearchConfig.load(None, latency_budget="quick", exports="none", runtimes=("eager",), seeds=())
    return Search(spec, CPU, config, storage=f"sqlite:///{tmp_path / 'optuna.db'}", track=False,
                  allow_nondeterministic=allow_nondeterministic)


def test_one_value_per_sample_is_scored_by_r2_not_cosine(spec_file: Path) -> None:
    assert _spec(spec_file).metric is OUTPUT_R2
    assert _spec(spec_file).extra_metrics == (MEAN_ABS_ERROR,)
    assert default_fidelity_metrics("embedding", torch.randn(8))[0] is OUTPUT_R2
    assert default_fidelity_metrics("embedding", torch.randn(8, 4))[0].name == "mean_cosine"
    reference = torch.rand(64, 1)
    assert output_r2(reference, reference).item() == 1.0
    mean = torch.full_like(reference, reference.mean().item())
    assert output_r2(mean, reference).item() == pytest.approx(0.0, abs=1e-5)
    assert output_r2(reference + 0.5, torch.zeros_like(reference)).item() == R2_FLOOR  # constant reference, missed
    assert output_r2(reference * 0.9, reference).item() < 0.99  # cosine would say 1.0


def test_stateful_model_is_caught_with_one_line(spec_file: Path) -> None:
    spec = _spec(spec_file)
    check = self_check(load_model(spec), spec, CPU)
    assert check.first == 1.0 and check.second < 0.9 and not check.stable
    with pytest.raises(SpecError) as caught:
        require_stable(check, spec.name, allow=False)
    message = str(caught.value)
    assert message.startswith("model 'streaming': its output_r2 moved from 1 to ")
    assert message.endswith("when the same inputs were scored again in the same batches: it keeps state between "
                            "calls or is nondeterministic; fix the model (reset its state in forward, eval mode, a "
                            "fixed seed) or pass --allow-nondeterministic to search anyway")
    assert "\n" not in message
    assert require_stable(check, spec.name, allow=True).startswith("warning: the baseline is unstable")


def test_with_the_studys_reference_the_line_names_state_not_the_batch_size(spec_file: Path) -> None:
    """A search reads the first scoring from its one reference pass and scores the subset again twice in the same
    batches before re-batching: a stateful model moves there, and the line names state, not the batch size (issue
    46: Silero VAD's line read like a batch-size dependence)."""
    spec = _spec(spec_file)
    model = load_model(spec)
    check = self_check(model, spec, CPU, reference=reference_outputs(load_model(spec), spec, CPU))
    assert not check.stable
    assert check.moved.endswith("when the same inputs were scored again in the same batches: it keeps state between "
                                "calls or is nondeterministic"), check.moved
    with pytest.raises(SpecError, match="it keeps state between calls or is nondeterministic"):
        require_stable(check, spec.name, allow=False)


def test_a_batch_size_dependence_is_named_as_such(spec_file: Path) -> None:
    spec = _spec(spec_file, "batch_centred")
    check = self_check(load_model(spec), spec, CPU)
    assert check.first == check.second and not check.stable
    assert check.moved.endswith("when the same inputs were scored in batches of 16 instead of 32: its outputs depend "
                                "on the batch size (padding or batch statistics in eval mode)"), check.moved
    assert "keeps state" not in check.moved


def test_with_a_reference_only_a_subset_is_scored_again(spec_file: Path) -> None:
    """Issue 46: the self-check re-scores a small subset, not the whole set; the first scoring is the study's."""
    spec = _spec(spec_file, "large")
    model = load_model(spec)
    rows: list[int] = []
    model.register_forward_hook(lambda _module, inputs, _output: rows.append(int(inputs[0].shape[0])))
    check = self_check(model, spec, CPU, reference=reference_outputs(load_model(spec), spec, CPU))
    assert check.stable and check.samples == SUBSET_SAMPLES
    assert sum(rows) == 3 * SUBSET_SAMPLES < 1280  # three passes over the subset; none over the 1280 samples


def test_deterministic_models_pass(spec_file: Path, residual_spec: ModelSpec) -> None:
    for spec in (_spec(spec_file, "stateless"), residual_spec):
        check = self_check(load_model(spec), spec, CPU)
        assert check.stable and check.first == check.second == pytest.approx(check.rebatched)
        assert require_stable(check, spec.name, allow=False).startswith("self-check:")


def test_search_stops_before_any_trial_unless_allowed(spec_file: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(spec_file)
    stopped = _search(spec, tmp_path)
    with pytest.raises(SpecError, match="keeps state between calls"):
        run_search(stopped, 2, console=Console(file=open(tmp_path / "out.txt", "w")))  # noqa: SIM115
    study = stopped.store.open_study(create=False)
    assert not study.trials and ATTR_SELF_CHECK not in study.user_attrs

    allowed = _search(spec, tmp_path, allow_nondeterministic=True)
    out = tmp_path / "allowed.txt"
    with out.open("w") as stream:
        outcome = run_search(allowed, 1, console=Console(file=stream, width=200))
    assert outcome.study.trials and outcome.study.user_attrs[ATTR_SELF_CHECK]["moved"]
    assert "warning: the baseline is unstable (--allow-nondeterministic): output_r2 1, then " in out.read_text()

    # Resumed: the recorded check is read back, not measured again, and still needs the flag.
    monkeypatch.setattr("paretorch.pipeline.search.store.self_check", lambda *a: pytest.fail("measured again"))
    again = _search(spec, tmp_path)
    with pytest.raises(SpecError, match="moved from 1 to"):
        again.ensure_baseline(again.store.open_study(create=False))
    allowed_again = _search(spec, tmp_path, allow_nondeterministic=True)
    allowed_again.ensure_baseline(allowed_again.store.open_study(create=False))


def test_cli_stops_with_one_error_line(spec_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--model", f"{spec_file}:spec", "--device", "cpu"]
    assert main(["optimize", *common, "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--no-tracking",
                 "--trials", "1", "--exports", "none", "--latency-budget", "quick"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: model 'streaming': its output_r2 moved from 1 to ") and err.count("\n") == 1
    assert "pass --allow-nondeterministic to search anyway" in err

    assert main(["evaluate", *common]) == EXIT_USER_ERROR
    assert "to evaluate anyway" in capsys.readouterr().err
    assert main(["evaluate", *common, "--allow-nondeterministic"]) == 0
    assert "warning: the baseline is unstable" in capsys.readouterr().out


def test_the_self_check_says_when_it_starts(residual_spec: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long step prints a start line (here at once: the wait before it is set to 0), then how long it took."""
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    stream = io.StringIO()
    self_check(load_model(residual_spec), residual_spec, CPU, stream)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("self-check: scoring residual_mlp again on 64 samples, twice and at batch ")
    assert lines[0].endswith(" ...")
    assert len(lines) == 2 and " done in " in lines[1]


def test_a_prose_line_wraps_between_words_at_80_columns() -> None:
    line = ("machine: 2 usable core(s), load 7.3 from other work: the trials' timings were settled at a 20% "
            "interval on 14 of 17 trials; /very/long/results/folder/studies/digits-abc/trial-003/recipe.json")
    terminal = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    log = Console(file=io.StringIO(), width=80)
    say(terminal, line)
    say(log, line)
    shown = terminal.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert len(shown) > 1 and all(len(row) <= 80 for row in shown)
    assert " ".join(shown).split() == line.split(), "every word whole"
    assert log.file.getvalue() == line + "\n", "a log file keeps the line whole"  # type: ignore[attr-defined]


def test_a_pairs_task_over_more_rows_than_the_subset_is_checked() -> None:
    """``--eval-data`` sentence pairs (a metric over the whole set, rows named by index) with more rows than the
    subset: the self-check scores the whole set with the subset's rows from each pass (it raised "expected the 400
    evaluation rows in order, got 256" on a real MPNet study)."""
    words = [f"w{i}" for i in range(400)]
    pairs = PairsData("toy", tuple(words[:200]), tuple(words[200:]), tuple(float(i % 7) for i in range(200)))
    base = ModelSpec(name="toy", build=lambda: copy.deepcopy(MODEL), example_inputs=lambda n: encode(["w1"] * n),
                     calibration=list, evaluation=list, metric=MEAN_ABS_ERROR, padding_mask=1, encode_text=encode,
                     output_kind="embedding")
    spec = with_task_data(base, pairs)
    assert sum(int(t.shape[0]) for _, t in spec.evaluation()) == 400 > SUBSET_SAMPLES
    check = self_check(load_model(spec), spec, CPU)
    assert check.stable and check.samples == SUBSET_SAMPLES and check.first == check.second == check.rebatched
