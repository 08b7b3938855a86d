"""Issue 11's bad inputs: each one gives one error naming the cause and what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from paretorch.pipeline.cli.main import main
from paretorch.pipeline.cli.store_urls import validate_storage_url
from paretorch.pipeline.core.errors import ConfigError, PipelineError, SpecError
from paretorch.pipeline.core.secrets import mask_secrets
from paretorch.pipeline.core.writable import check_writable_dir
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search.config import SearchConfig
from paretorch.pipeline.sources.archive import check_batch_flexible
from paretorch.pipeline.sources.inputs import TensorInputs, parse_input_shape


def test_mask_secrets_masks_url_passwords_and_password_keys() -> None:
    text = ("postgresql://bob:s3cret@db:5432/x failed; MLflow: http://u:p%40ss@h:5000/; "
            "dsn host=db password=s3cret; sqlite:///runs/optuna.db; postgresql://bob@db/x; bob:s3cret@db/x")
    masked = mask_secrets(text)
    assert "s3cret" not in masked and "p%40ss" not in masked and "bob:***@db/x" in masked
    assert "postgresql://bob:***@db:5432/x" in masked and "http://u:***@h:5000/" in masked
    assert "sqlite:///runs/optuna.db" in masked and "postgresql://bob@db/x" in masked


def test_results_dir_that_is_a_file_or_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(PipelineError, match="is a file: remove the file or choose another directory with --x"):
        check_writable_dir(blocker, "the results directory", "--x")
    with pytest.raises(PipelineError, match=r"lies under a file \(.*afile\)"):
        check_writable_dir(blocker / "sub", "the results directory", "--x")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only directories")
def test_read_only_results_dir_names_the_permission_problem(tmp_path: Path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(PipelineError, match="not writable by this user"):
            check_writable_dir(tmp_path, "the results directory", "--results-dir")
    finally:
        tmp_path.chmod(0o755)


def test_cli_results_dir_under_a_file_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    code = main(["evaluate", "--model", "digits", "--results-dir", str(blocker / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: the results directory") and len(err.strip().splitlines()) == 1


def test_unknown_runtime_in_a_recipe_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="unknown runtime\\(s\\) turbo in the recipe: choose from eager"):
        Recipe.from_dict({"runtime": "turbo", "stages": []})


def test_huge_input_shape_is_refused_before_allocation() -> None:
    with pytest.raises(SpecError, match=r"--input-shape 1x100000x100000: .* GiB \(limit 4 GiB\)"):
        parse_input_shape("1x100000x100000")
    assert parse_input_shape("1x3x224x224")[0].sample_shape == (3, 224, 224)


def test_flag_errors_name_the_flag_not_the_config_file() -> None:
    with pytest.raises(ConfigError, match=r"^--latency-batch: latency_batch=0"):
        SearchConfig.load(latency_batch=0)


def test_max_drop_is_checked_against_the_metric_range(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["optimize", "--model", "digits", "--max-drop", "5", "--no-tracking", "--trials", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--max-drop 5: accuracy lies in [0, 1]" in err


def test_storage_urls_are_checked_and_journal_paths_accepted(tmp_path: Path) -> None:
    validate_storage_url(f"journal:{tmp_path / 'optuna.journal'}")  # a file in an existing directory
    with pytest.raises(ConfigError, match="journal:PATH needs a file path"):
        validate_storage_url("journal:")
    with pytest.raises(ConfigError, match="not a storage URL"):
        validate_storage_url("runs/optuna.db")


class TakesARate(nn.Module):
    def forward(self, x: torch.Tensor, rate: int) -> torch.Tensor:
        return x * rate


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.calls


class Plain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


INPUTS = TensorInputs(templates=parse_input_shape("1x8"))


def test_torchscript_forward_with_a_non_tensor_argument_says_how_to_wrap() -> None:
    with pytest.raises(SpecError, match=r"forward takes rate: int; only tensor arguments are supported. Wrap it"):
        check_batch_flexible(torch.jit.script(TakesARate()), INPUTS, "m.pt")


def test_stateful_model_is_detected() -> None:
    with pytest.raises(SpecError, match=r"different outputs for the same input .* keeps state"):
        check_batch_flexible(torch.jit.script(Counter()), INPUTS, "m.pt")
    assert check_batch_flexible(torch.jit.script(Plain()), INPUTS, "m.pt").shape == (2, 8)
