"""--storage and --tracking-uri: a URL neither can open, or a local file in a missing directory outside the results
folder, is one error line that says what to pass; nothing is created outside the results folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from paretorch.pipeline.cli.main import EXIT_USER_ERROR, main
from paretorch.pipeline.cli.store_urls import validate_storage_url, validate_tracking_uri
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.paths import RESULTS_ENV_VAR


def error_line(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    code = main(["optimize", "--model", "digits", "--trials", "1", "--no-tracking", *flags])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("url", ["notaurl", "foo://bar", "runs/optuna.db"])
def test_a_storage_that_is_no_url_lists_the_accepted_forms(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(capsys, "--storage", url)
    assert err.startswith(f"error: --storage {url}: not a storage URL this tool opens; use sqlite:///PATH")
    assert "journal:PATH" in err and "postgresql://USER:" in err and "plugin" not in err


def test_a_storage_password_stays_masked(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(capsys, "--storage", "oracle://scott:tiger@db/x")
    assert "tiger" not in err and "oracle://scott:***@db/x" in err


def test_a_sqlite_file_in_a_missing_directory_is_one_error_and_nothing_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for folder in (Path("/nonexistent-paretorch/dir"), tmp_path / "missing" / "dir"):
        err = error_line(capsys, "--storage", f"sqlite:///{folder / 'optuna.db'}")
        assert f"the directory {folder} does not exist" in err and "create it" in err
        assert not folder.parent.exists(), "never a silent mkdir outside the results folder"
    err = error_line(capsys, "--storage", f"journal:{tmp_path / 'gone' / 'optuna.journal'}")
    assert f"the directory {tmp_path / 'gone'} does not exist" in err and not (tmp_path / "gone").exists()


def test_a_missing_directory_in_the_results_folder_is_created_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RESULTS_ENV_VAR, str(tmp_path / "results"))
    validate_storage_url(f"sqlite:///{tmp_path / 'results' / 'studies' / 'optuna.db'}")
    validate_tracking_uri(f"sqlite:///{tmp_path / 'results' / 'sub' / 'mlflow.db'}")
    validate_storage_url("postgresql+psycopg://u:p@host/db")
    validate_tracking_uri("https://mlflow.example.org")
    with pytest.raises(ConfigError, match="journal:PATH needs a file path"):
        validate_storage_url("journal:")


@pytest.mark.parametrize("uri", ["foo://bar", "notauri", "file:///tmp/mlruns"])
def test_a_bad_tracking_uri_names_the_accepted_schemes(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["optimize", "--model", "digits", "--trials", "1", "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and err.count("\n") == 1
    assert err.startswith(f"error: --tracking-uri {uri}: not an MLflow store this tool opens; use sqlite:///PATH")
    assert "http://HOST:PORT" in err and "--no-tracking" in err and "registry" not in err


def test_a_tracking_store_in_a_missing_directory_is_one_error(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "none" / "here"
    code = main(["optimize", "--model", "digits", "--trials", "1", "--tracking-uri", f"sqlite:///{folder}/mlflow.db"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and err.count("\n") == 1 and f"the directory {folder} does not exist" in err
    assert not folder.parent.exists()
