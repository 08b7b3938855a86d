"""Three workers on one study with a real PostgreSQL (the ``pgserver`` wheel) and a real ``mlflow server``.

Checks the trial count, one MLflow parent, one child run per trial, no duplicate configs, and that the
passwords in both URLs appear in no output and no store. Skipped, with the reason, when a server cannot start.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState
from torch import nn

from paretorch.experiments.screenshots import free_port, serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "Hunter2pw"
TRIALS = 6


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PostgreSQL server on a Unix socket; its URL (with a password, which trust auth ignores)."""
    try:
        import pgserver
    except ImportError as exc:
        pytest.skip(f"PostgreSQL: the pgserver wheel is not installed ({exc})")
    # Not under pytest's private (0700) temp dir: pgserver runs the server as its own user when root.
    data = Path(tempfile.mkdtemp(prefix="paretorch-pg-"))
    data.chmod(0o755)
    try:
        server = pgserver.get_server(str(data), cleanup_mode="stop")
    except Exception as exc:  # no usable initdb/postgres here: skip with the cause
        pytest.skip(f"PostgreSQL could not start: {type(exc).__name__}: {exc}")
    yield f"postgresql://postgres:{PASSWORD}@/postgres?host={data}"
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``mlflow server`` on 127.0.0.1 in its own process group (stopped as a group); its URL and store dir."""
    store = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
               f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination", str(store / "artifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = serving(command, f"http://127.0.0.1:{port}/health", store / "server.log", timeout=120)
    try:
        server.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"mlflow server did not start: {exc}")
    try:
        yield f"http://paretorch:{PASSWORD}@127.0.0.1:{port}", store
    finally:
        server.__exit__(None, None, None)


def text_of_tree(path: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in path.rglob("*") if p.is_file())


def test_three_workers_on_postgresql_and_an_mlflow_server(postgres: str, mlflow_server: tuple[str, Path],
                                                          tmp_path: Path, pristine_digits_model: nn.Module,
                                                          results_dir: Path) -> None:
    tracking, store = mlflow_server
    results = tmp_path / "results"
    # The session's trained digits weights, as the e2e test does: the search does not train the model again.
    shutil.copytree(results_dir / "cache" / "weights", results / "cache" / "weights")
    done = subprocess.run(
        [sys.executable, "-m", "paretorch", "optimize", "--model", "digits", "--workers", "3", "--trials",
         str(TRIALS), "--storage", postgres, "--tracking-uri", tracking, "--latency-budget", "quick",
         "--exports", "none", "--runtimes", "eager", "--threads", "1", "--results-dir", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output

    storage = optuna.storages.RDBStorage(postgres.replace(PASSWORD, ""))
    (summary,) = storage.get_all_studies()
    trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) == TRIALS and not [t for t in trials if t.state == TrialState.RUNNING]
    assert len({t.user_attrs.get("paretorch.worker") for t in finished}) == 3
    keys = collections.Counter(t.user_attrs["paretorch.config_key"] for t in finished
                               if t.state == TrialState.COMPLETE)
    assert max(keys.values()) == 1  # no config ran twice

    client = MlflowClient(tracking_uri=tracking.replace(f"paretorch:{PASSWORD}@", ""))
    experiment = client.get_experiment_by_name("paretorch/digits")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("paretorch.role") == "study"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = collections.Counter(r.data.tags["paretorch.trial"] for r in runs
                                   if r.data.tags.get("paretorch.role") == "trial")
    assert sorted(int(n) for n in children) == sorted(t.number for t in finished)
    assert max(children.values()) == 1

    dump = [output, text_of_tree(store), text_of_tree(results)]
    with storage.engine.connect() as connection:
        from sqlalchemy import text

        for table in ("studies", "study_user_attributes", "study_system_attributes", "trials",
                      "trial_user_attributes", "trial_system_attributes", "trial_params"):
            dump.append(repr(connection.execute(text(f"SELECT * FROM {table}")).fetchall()))
    assert "***@" in output
    leaks = [line[:300] for part in dump for line in part.splitlines() if PASSWORD in line]
    assert not leaks
