"""Headless-Chromium screenshots of what a user opens over a finished study (``make screenshots``).

Starts the MLflow UI and optuna-dashboard over a results folder on free local ports,
takes PNGs of the MLflow runs table (model-training view, headline columns), each study's
parent run, and the dashboard's study, trials and note pages (plus the first infeasible trial
it badges "Best Trial", with its note), then stops both servers. Needs ``chromium`` on the PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
from mlflow import MlflowClient

from paretorch.pipeline.core.paths import results_dir
from paretorch.pipeline.search.dashboard import badged_infeasible
from paretorch.pipeline.tracking.tracker import ROLE_TAG, experiment_name
from paretorch.pipeline.tracking.views import experiment_url, run_view_url

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=20000")
#: Window size of most shots; the runs table is taken at a common laptop's 1366 px, where its headline columns
#: must read with MLflow 3.17's Assistant panel open (a new browser profile opens it):
#: paretorch.pipeline.tracking.columns.
WINDOW = (1600, 1000)
RUNS_WINDOW = (1366, 800)


def chromium() -> str | None:
    """The Chromium executable, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(command: list[str], health: str, log: Path, timeout: float = 240) -> Iterator[None]:
    """Run a server until its ``health`` URL answers 200; stop its process group afterwards."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=5) as response:
                if response.status == 200:
                    break
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited {process.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{health} did not answer in {timeout:.0f} s; see {log}")
            time.sleep(1)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # workers that outlived their parent (mlflow's huey)
            os.killpg(process.pid, signal.SIGKILL)


def screenshot(browser: str, url: str, path: Path, window: tuple[int, int] = WINDOW) -> Path:
    """A PNG of ``url`` from a fresh browser profile (no stored UI state)."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--window-size={window[0]},{window[1]}",
                        f"--user-data-dir={profile}", f"--screenshot={path}", url],
                       check=True, capture_output=True, timeout=180)
    return path


@contextlib.contextmanager
def mlflow_ui(results: Path, output: Path, base: str | None = None) -> Iterator[str]:
    """The base URL of an MLflow UI over ``results``: ``base`` when one is already serving it (``make ui``), else one
    started for the block."""
    if base is not None:
        yield base
        return
    port = free_port()
    started = f"http://127.0.0.1:{port}"
    store = f"sqlite:///{results / 'mlflow.db'}"
    with serving([str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", store,
                  "--artifacts-destination", str(results / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port),
                  "--workers", "1"], f"{started}/health", output / "mlflow-ui.log"):
        yield started


def take(results: Path, output: Path, model: str, mlflow_base: str | None = None) -> list[Path]:
    """Screenshots of the MLflow runs view, the parent runs and optuna-dashboard over ``results`` (``mlflow_base``: an
    MLflow UI already serving ``results``; None: one is started)."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (Debian: apt-get install -y chromium)")
    output.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    store = f"sqlite:///{results / 'mlflow.db'}"
    experiment = MlflowClient(tracking_uri=store).get_experiment_by_name(experiment_name(model))
    if experiment is None:
        raise RuntimeError(f"no MLflow experiment {experiment_name(model)} in {store}: run make optimize first")
    parents = MlflowClient(tracking_uri=store).search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'study'")
    shots: list[Path] = []
    with mlflow_ui(results, output, mlflow_base) as base:
        shots.append(screenshot(browser, experiment_url(base, experiment), output / "mlflow-runs.png", RUNS_WINDOW))
        for i, parent in enumerate(parents):
            url = run_view_url(base, experiment.experiment_id, parent.info.run_id)
            shots.append(screenshot(browser, url, output / f"mlflow-parent-{i}.png"))
            plot = run_view_url(base, experiment.experiment_id, parent.info.run_id, artifact="pareto.png")
            shots.append(screenshot(browser, plot, output / f"mlflow-parent-{i}-plot.png"))
    optuna_store = f"sqlite:///{results / 'optuna.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(optuna_store)[0], storage=optuna_store)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving([str(bin_dir / "optuna-dashboard"), f"sqlite:///{results / 'optuna.db'}", "--host", "127.0.0.1",
                  "--port", str(port)], f"{base}/dashboard", output / "dashboard.log"):
        shots.append(screenshot(browser, f"{base}/dashboard/studies/1", output / "dashboard-study.png"))
        shots.append(screenshot(browser, f"{base}/dashboard/studies/1/analytics", output / "dashboard-analytics.png"))
        shots.append(screenshot(browser, f"{base}/dashboard/studies/1/trials", output / "dashboard-trials.png"))
        shots.append(screenshot(browser, f"{base}/dashboard/studies/1/note", output / "dashboard-note.png"))
        for trial in badged_infeasible(study.get_trials(deepcopy=False), study.directions)[:1]:
            shots.append(screenshot(browser, f"{base}/dashboard/studies/1/trials?numbers={trial.number}",
                                    output / "dashboard-badged-infeasible.png"))
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--output", type=Path, default=None, help="default: <results>/screenshots")
    args = parser.parse_args(argv)
    results = results_dir()
    for path in take(results, args.output or results / "screenshots", args.model):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
