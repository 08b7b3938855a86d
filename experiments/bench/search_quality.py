"""Search quality: hypervolume against trial count. Does a short search reach the front of a long one?

``python -m paretorch.experiments.bench.search_quality --model digits --trials 100 --compare 30 --seeds 0 1``
runs a search of ``--trials`` trials with the first sampler seed and one of ``--compare`` trials with each
other seed (fresh studies, no tracking, in ``sqlite:///<results>/search-quality.db``), then reads them back.
``--storage URL [--study NAME ...]`` reads studies run elsewhere instead (SQLite, ``journal:PATH`` or
PostgreSQL; every study in the storage when no ``--study`` is given) and runs nothing.

For each study: the hypervolume of its feasible trials after each trial (the scale is in
:mod:`paretorch.experiments.bench.hypervolume`), its front after ``--compare`` trials and at its end. The verdict:
does each run reach >= 95 % after ``--compare`` trials, of the longest run's final volume and of the volume of
the union of every run's trials? Results go to ``results/search-quality-<model>-<device>-b<batch>.json``
with a PNG of the curves beside it; ``python -m paretorch.experiments.bench --render-only`` puts the section in
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

import optuna
import torch
from rich.console import Console

from paretorch.experiments.bench.hypervolume import (
    FrontPoint,
    RunVolumes,
    TrialPoint,
    VolumeAnalysis,
    counted_prefix,
    history,
    hypervolume,
    pareto_front,
)
from paretorch.experiments.bench.paths import MARKDOWN, RESULTS_DIR
from paretorch.experiments.bench.search_quality_plot import save_figure
from paretorch.experiments.bench.study_points import StudyPoints, check_comparable, study_points
from paretorch.pipeline.core.device import describe, resolve_device
from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.core.paths import results_dir
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.storage import open_storage
from paretorch.pipeline.sources.resolve import resolve_spec

#: Where BENCHMARKS.md lives: its links to the PNGs are relative to it.
SEARCH_QUALITY_PREFIX = "search-quality-"
#: The objective batch of a search on the CPU (as the benchmark tool's).
CPU_BATCH = 32
#: The share of the long run's (or the union's) volume a short search must reach.
TARGET = 0.95
NORMALISATION = ("hypervolume over the feasible trials only, in (share of the allowed drop kept = 1 - drop / "
                 "allowed, clipped to [0, 1]; ln of the paired speed-up over the baseline, clipped at 0); reference "
                 "point: the baseline at the allowed drop (0, 0). One recipe at no drop and speed-up s alone has "
                 "volume ln s. Both scales come from the study's own baseline and allowed drop, so runs of one "
                 "search config compare; a metric above the baseline counts as no drop (the search keeps the "
                 "metric, a gain on the evaluation data is mostly noise).")


class Provenance(TypedDict):
    commit: str
    changed_files: int | None
    machine: str
    cores: list[int]
    date: str


class SearchQualityResult(Provenance, VolumeAnalysis):
    """A ``search-quality-*.json`` file: the analysis, where it ran, and its figure's file name."""

    model: str
    device: str
    mode: str
    load_before: float
    load_after: float
    note: str
    png: NotRequired[str]


def run_study(model: str, device: torch.device, trials: int, seed: int, batch: int, storage: str) -> str:
    """One fresh search (no tracking, no exports) with sampler seed ``seed`` and objective batch ``batch``; its
    study's name."""
    config = SearchConfig.load(None, exports="none", seed=seed, latency_batch=batch)
    name = f"search-quality-{model}-{device.type}-b{batch}-seed{seed}-{trials}t-{int(time.time())}"
    search = Search(resolve_spec(model), device, config, storage=storage, track=False, name=name)
    run_search(search, trials, console=Console(stderr=True))
    return name


def load_studies(storages: list[str], names: list[str]) -> list[StudyPoints]:
    """The named studies (every study when ``names`` is empty) of the storages, in the order found."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    found: list[StudyPoints] = []
    for url in storages:
        storage = open_storage(url)
        for summary in storage.get_all_studies():
            if not names or summary.study_name in names:
                found.append(study_points(optuna.load_study(study_name=summary.study_name, storage=storage)))
    missing = [n for n in names if n not in {s.name for s in found}]
    if missing:
        raise PipelineError(f"no study {', '.join(map(repr, missing))} in {', '.join(storages)}")
    if not found:
        raise PipelineError(f"no study in {', '.join(storages)}")
    check_comparable(found)
    return found


def _front_rows(points: list[TrialPoint]) -> list[FrontPoint]:
    return [{"study": p.study, "trial": p.number, "drop_share": p.drop_share, "speedup": p.speedup,
             "recipe": p.recipe} for p in pareto_front(points)]


def _ratio(part: float | None, whole: float) -> float | None:
    return part / whole if part is not None and whole > 0 else None


def analyse(studies: list[StudyPoints], compare: int) -> VolumeAnalysis:
    """Per study: its hypervolume history and fronts; the ratios of each after ``compare`` trials to the longest
    run's final volume and to the union's; the verdicts at :data:`TARGET`."""
    reference = max(studies, key=lambda s: s.trials)  # the first of the longest
    union = [p for s in studies for p in s.points]
    hv_union = hypervolume(union)
    hv_reference = hypervolume(reference.points)
    runs: list[RunVolumes] = []
    for study in studies:
        volumes = history(study.points)
        at = volumes[compare - 1] if len(volumes) >= compare else None
        runs.append({
            "study": study.name, "seed": study.search.get("seed"), "sampler": study.search.get("sampler"),
            "trials": study.trials, "seconds": None if math.isnan(study.seconds) else study.seconds,
            "feasible": sum(p.feasible for p in study.points), "unstable": study.unstable, "history": volumes,
            "hv_at_compare": at, "hv_final": volumes[-1] if volumes else 0.0,
            "vs_reference": _ratio(at, hv_reference), "vs_union": _ratio(at, hv_union),
            "front_at_compare": _front_rows(counted_prefix(study.points, compare)),
            "front": _front_rows(study.points),
        })
    measured = [r for r in runs if r["hv_at_compare"] is not None]

    def reached(key: Literal["vs_reference", "vs_union"]) -> bool | None:
        ratios: list[float | None] = [r[key] for r in measured]
        known = [r for r in ratios if r is not None]
        return min(known) >= TARGET if known and len(known) == len(ratios) else None

    return {"compare": compare, "target": TARGET, "normalisation": NORMALISATION, "reference": reference.name,
            "baseline": {"metric": reference.baseline.metric_value, "latency_ms": reference.baseline.latency_ms,
                         "allowed_drop": reference.allowed},
            "search": {k: reference.search.get(k) for k in ("objectives", "max_drop", "sampler", "latency_batch",
                                                            "latency_budget", "runtimes")},
            "hv_reference": hv_reference, "hv_union": hv_union, "union_front": _front_rows(union), "runs": runs,
            "reached_reference": reached("vs_reference"), "reached_union": reached("vs_union")}


def provenance() -> Provenance:
    """The commit and how many files differ from it (the search code measured), the machine and its load."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=RESULTS_DIR, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else "?"
    status = git("status", "--short")
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "changed_files": len(status.splitlines()) if status != "?" else None,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
                       f"{torch.__version__}, optuna {optuna.__version__}",
            "cores": sorted(os.sched_getaffinity(0)), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _pct(value: float | None) -> str:
    return f"{100 * value:.1f} %" if value is not None else "-"


def _yes(value: bool | None) -> str:
    return {True: "**yes**", False: "**no**", None: "-"}[value]


def _front_text(rows: list[FrontPoint], recipes: bool = False) -> str:
    """``#7 3.14x at 0 % of the drop; ...``; with ``recipes``, each point's recipe and study in brackets."""
    def where(row: FrontPoint) -> str:
        return " (" + ", ".join(([f"`{row['recipe']}`"] if row["recipe"] else []) + [row["study"]]) + ")"
    return "; ".join(f"#{r['trial']} {r['speedup']:.2f}x at {100 * max(r['drop_share'], 0.0):.0f} % of the drop"
                     + (where(r) if recipes else "") for r in rows) or "none feasible"


def render(result: SearchQualityResult) -> str:
    """The BENCHMARKS.md section of one result file."""
    compare = result["compare"]
    batch = result["search"].get("latency_batch")
    lines = [f"### Search quality: {result['model']} on {result['device']} (hypervolume against trials"
             + (f", objective batch {batch}" if batch else "") + ")", "",
             f"{result['mode']}; commit {result['commit']} with {result['changed_files']} changed file(s); "
             f"{result['machine']}; {result['date']}; load {result['load_before']:.2f} before, "
             f"{result['load_after']:.2f} after.", "",
             f"Scale: {result['normalisation']}", "",
             f"Does a {compare}-trial search reach {100 * result['target']:.0f} % of the volume? Of the longest run "
             f"({result['reference']}, {result['hv_reference']:.3f}): {_yes(result['reached_reference'])}; of the "
             f"union of all runs ({result['hv_union']:.3f}): {_yes(result['reached_union'])}.", "",
             f"| study | seed | trials | seconds | feasible (latency unstable) | HV after {compare} | HV at the end | "
             f"after {compare} / longest run | after {compare} / union |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in result["runs"]:
        at = f"{run['hv_at_compare']:.3f}" if run["hv_at_compare"] is not None else "-"
        seconds = f"{run['seconds']:.0f}" if run["seconds"] is not None else "-"
        lines.append(f"| {run['study']} | {run['seed']} | {run['trials']} | {seconds} | {run['feasible']} "
                     f"({run.get('unstable', 0)}) | {at} | {run['hv_final']:.3f} | {_pct(run['vs_reference'])} | "
                     f"{_pct(run['vs_union'])} |")
    for run in result["runs"]:
        lines += ["", f"Front of {run['study']} after {compare} trials: {_front_text(run['front_at_compare'])}"
                  + (f"; after {run['trials']}: {_front_text(run['front'])}." if run["trials"] > compare else ".")]
    lines += ["", f"Union front: {_front_text(result['union_front'], recipes=True)}."]
    if result.get("note"):
        lines += ["", f"Note: {result['note']}"]
    link = RESULTS_DIR.relative_to(MARKDOWN.parent) / result["png"]
    lines += ["", f"![hypervolume against trials]({link.as_posix()})"]
    return "\n".join(lines)


def result_name(model: str, device: str, batch: int | None) -> str:
    """``search-quality-digits-cpu-b32``, ``search-quality-minilm-cuda-b256`` (no batch: the spec's first)."""
    return f"{SEARCH_QUALITY_PREFIX}{model}-{device}" + (f"-b{batch}" if batch else "")


def bad_input(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags, in one line; None when nothing is."""
    if min(args.trials, args.compare, args.batch or 1) < 1:
        return "--trials, --compare and --batch must be >= 1"
    if args.study and not args.storage:
        return "--study needs --storage"
    if args.compare > args.trials:
        return f"--compare {args.compare} is more than --trials {args.trials}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.search_quality",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="digits", help="the model spec to search (a label with --storage)")
    parser.add_argument("--device", default="cpu", help="the device to search on (a label with --storage)")
    parser.add_argument("--trials", type=int, default=100, help="trials of the long run (first seed)")
    parser.add_argument("--compare", type=int, default=30, help="trials of a short search (each other seed)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="sampler seeds, the long run's first")
    parser.add_argument("--batch", type=int, default=None, help="objective batch size of the searches run here "
                        f"(default: as `python -m paretorch.experiments.bench`, {CPU_BATCH} on the CPU, "
                        "1 on accelerators)")
    parser.add_argument("--storage", action="append", default=[], metavar="URL",
                        help="read the studies of this storage (sqlite:///PATH, journal:PATH, postgresql://...) "
                        "instead of running searches; repeatable")
    parser.add_argument("--study", action="append", default=[], metavar="NAME",
                        help="with --storage: only this study (repeatable; default every study there)")
    parser.add_argument("--note", default="", help="a line for BENCHMARKS.md (where the studies ran, what changed)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    problem = bad_input(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        load_before = os.getloadavg()[0]
        if args.storage:
            mode, device_text = f"read from {', '.join(args.storage)}", args.device
            studies = load_studies(args.storage, args.study)
        else:
            device = resolve_device(args.device)
            batch = args.batch or (CPU_BATCH if device.type == "cpu" else 1)
            storage = f"sqlite:///{results_dir() / 'search-quality.db'}"
            names = [run_study(args.model, device, args.trials if i == 0 else args.compare, seed, batch, storage)
                     for i, seed in enumerate(args.seeds)]
            mode, device_text = f"run here ({storage})", describe(device)
            studies = load_studies([storage], names)
        load_after = os.getloadavg()[0]
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result: SearchQualityResult = {"model": args.model, "device": device_text, "mode": mode, **provenance(),
              "load_before": load_before, "load_after": load_after, "note": args.note,
              **analyse(studies, args.compare)}
    batch = result["search"]["latency_batch"]
    name = result_name(args.model, args.device, batch if isinstance(batch, int) else None)
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"{name}.png"
    result["png"] = png.name  # beside the JSON
    save_figure(result, f"{args.model} on {device_text}", png)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
