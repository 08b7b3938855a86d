"""The ``optimize``, ``report`` and ``apply`` subcommands of ``python -m pipeline``.

* ``optimize``: run (or resume) the study, log it to MLflow, print the Pareto table;
* ``report``: print the Pareto table of a study again, from its storage alone;
* ``apply --recipe FILE``: replay one recipe (same stages, same exports) through
  the same runner: the scripted-reuse path for CI jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from pipeline.cli.args import add_model_args, spec_from_args
from pipeline.cli.store_urls import validate_storage_url, validate_tracking_uri
from pipeline.core.device import resolve_device
from pipeline.core.errors import ConfigError, PipelineError
from pipeline.core.paired import free_cores, load_average, usable_cores
from pipeline.core.paths import cache_dir, results_dir
from pipeline.core.report import evaluation_table, format_bytes
from pipeline.core.secrets import mask_secrets
from pipeline.core.self_check import ALLOW_FLAG
from pipeline.core.spec import ModelSpec
from pipeline.engine.cache import NodeCache
from pipeline.engine.deliver import deliver
from pipeline.engine.graph import recipe_pipeline
from pipeline.engine.recipe import Recipe
from pipeline.engine.runner import Runner
from pipeline.engine.short_recipe import short_recipe
from pipeline.search import LATENCY_BUDGETS, Search, SearchConfig, SeedRecipe, run_search
from pipeline.search.config import finished_states
from pipeline.search.finish import front_files
from pipeline.search.front import machine_line
from pipeline.search.loop import THIRD_PARTY_LOG, run_worker
from pipeline.search.objectives import ATTR_BASELINE, Baseline
from pipeline.search.pareto import FRONT_NOTE, pareto_rows, pareto_table
from pipeline.search.quiet import stderr_to
from pipeline.search.recorded import RECORDED, recorded_cells
from pipeline.search.workers import WORKER_FLAG, launch_workers

Command = Any


def register_search_commands(sub: argparse._SubParsersAction[Any], commands: dict[str, Command]) -> None:
    """Add ``optimize``, ``report`` and ``apply`` to the CLI's subparsers."""
    optimize = sub.add_parser(
        "optimize",
        help="search prune/distill/quantize/AMP/runtime trade-offs, log trials to MLflow, print the Pareto table",
        description="Search accuracy/latency trade-offs over composed stages with Optuna; every trial is logged to "
        "MLflow; the Pareto trials are exported (Core ML, ONNX) at the end. Re-running the same command resumes the "
        "study; --trials is the study's total.")
    add_model_args(optimize)
    add_search_args(optimize)
    optimize.add_argument("--trials", type=int, default=20, help="total finished trials of the study (default 20)")
    optimize.add_argument("--timeout", type=float, default=None, help="stop starting trials after this many seconds")
    optimize.add_argument("--enqueue", action="append", default=[], metavar="RECIPE",
                          help="run this recipe file as a trial first (repeatable; skipped if already run)")
    optimize.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    optimize.add_argument("--workers", type=int, default=1,
                          help="run the study in this many processes on this machine (default 1); more machines: "
                          "run optimize on each with one --storage postgresql://... and --tracking-uri http://...")
    optimize.add_argument(WORKER_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    add_threads_arg(optimize)
    commands["optimize"] = cmd_optimize

    report = sub.add_parser("report", help="print a study's Pareto table again, from its storage",
                            description="Print the Pareto table of the study that the same optimize options name "
                            "(or --study-name), read back from the Optuna storage.")
    add_model_args(report)
    add_search_args(report)
    report.add_argument("--json", action="store_true", help="print the Pareto rows as JSON")
    add_threads_arg(report)  # accepted (and unused) so that make's ARGS work for optimize and report alike
    commands["report"] = cmd_report

    apply = sub.add_parser("apply", help="replay one recipe: same stages, same exports, measured",
                           description="Replay a recipe file (from a study's Pareto trials) on the model: apply its "
                           "stages, measure the result, write its exports. For scripts and CI jobs.")
    add_model_args(apply)
    apply.add_argument("--recipe", required=True,
                       help="a recipe JSON file (runs/studies/<study>/trial-NNN/recipe.json)")
    apply.add_argument("--output", default=None, help="where the exports and apply.json go "
                       "(default: <results>/apply/<recipe name>)")
    apply.add_argument("--no-export", action="store_true", help="apply and measure only; skip the exports")
    apply.add_argument("--latency-budget", default="normal", choices=tuple(LATENCY_BUDGETS))
    apply.add_argument("--json", action="store_true", help="print the measurements and exports as JSON")
    add_threads_arg(apply)
    commands["apply"] = cmd_apply


def add_nondeterministic_arg(parser: argparse._ActionsContainer) -> None:
    """``--allow-nondeterministic`` (optimize, report and evaluate): see :mod:`pipeline.core.self_check`."""
    parser.add_argument(ALLOW_FLAG, action="store_true",
                        help="go on when the unoptimized model scores differently twice or at another batch size "
                        "(a model that keeps state between calls or is nondeterministic); the run says by how much")


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice). On a loaded machine, 1 thread "
                        "gives steadier latencies than several threads waiting on each other")


def set_threads(threads: int | None) -> None:
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"--threads={threads}: must be >= 1")

    torch.set_num_threads(threads)


def threads_line(threads: int | None, device: torch.device, workers: int = 1) -> str:
    """Never oversubscribe: without ``--threads``, a CPU search runs on at most the cores free now (the
    usable cores minus the 1-minute load of other work, shared among the workers). The header line."""
    if threads is not None:
        return f"threads: {torch.get_num_threads()} (--threads)"
    if device.type != "cpu":
        return f"threads: {torch.get_num_threads()} (torch's choice; the model runs on {device.type})"
    load, cores = load_average(), usable_cores()
    chosen = max(1, min(torch.get_num_threads(), free_cores(load, cores) // workers))
    torch.set_num_threads(chosen)
    share = f", {workers} workers" if workers > 1 else ""
    return (f"threads: {chosen} ({cores} usable core(s), load {load:.1f} from other work{share}; "
            f"--threads N to choose)")


def add_search_args(parser: argparse.ArgumentParser) -> None:
    """Options that name a study (shared by ``optimize`` and ``report``); unset ones come from the search config."""
    group = parser.add_argument_group("search (defaults from pipeline/defaults/search.yaml)")
    group.add_argument("--search-config", default=None, metavar="YAML", help="a search config file")
    add_nondeterministic_arg(group)
    group.add_argument("--pipeline", default=None,
                       help="default, a name in pipeline/defaults/pipelines/ or a YAML path")
    group.add_argument("--max-drop", default=None, metavar="DROP",
                       help="allowed metric drop vs the unoptimized model: absolute (0.01) or a percentage of "
                       "the baseline metric (1%%) (default 0.01)")
    group.add_argument("--sampler", default=None, choices=("tpe", "nsga2", "random"))
    group.add_argument("--seed", type=int, default=None, help="sampler seed")
    group.add_argument("--objectives", default=None, help="comma list of metric,latency,size (default metric,latency)")
    group.add_argument("--minimize-size", action="store_true", help="add the serialized size as a third objective")
    group.add_argument("--runtimes", default=None, help="comma list of runtimes to search (eager,compile,...)")
    group.add_argument("--latency-budget", default=None, choices=tuple(LATENCY_BUDGETS),
                       help="latency measurement effort per trial, timed alone and paired with the baseline "
                       "(quick: 1 call per side per paired round; a search times the objective batch only; "
                       "docs/latency.md)")
    group.add_argument("--latency-batch", type=int, default=None, help="batch size of the latency objective")
    group.add_argument("--disable", default=None, help="comma list of stage nodes kept off (e.g. amp,prune)")
    group.add_argument("--exports", default=None, choices=("pareto", "every_trial", "none"),
                       help="when exports run (default: for the Pareto trials, after the search)")
    group.add_argument("--cache-mb", type=int, default=None, help="memory bound of the model cache (MiB)")
    group.add_argument("--storage", default=None, help="Optuna storage URL (default sqlite:///<results>/optuna.db)")
    group.add_argument("--study-name", default=None, help="use this study name instead of the derived one")
    group.add_argument("--accept-plugin-change", action="store_true",
                       help="resume a study although its stages or runtimes changed (a plugin installed or removed)")
    group.add_argument("--tracking-uri", default=None,
                       help="MLflow tracking URI (default sqlite:///<results>/mlflow.db; "
                       "http://host:port for a server)")


def make_console() -> Any:
    """A rich console; wide when writing to a file or pipe (make, CI logs) so tables do not fold."""

    return Console() if sys.stdout.isatty() else Console(width=200)


def _split(text: str | None) -> tuple[str, ...] | None:
    return tuple(p.strip() for p in text.split(",") if p.strip()) if text else None


def build_search(args: argparse.Namespace, spec: ModelSpec, track: bool = True, name: str | None = None) -> Search:
    """The :class:`Search` that the CLI options describe (``name``: this study, not the one they name)."""
    objectives = _split(args.objectives)
    if args.minimize_size:
        objectives = tuple(dict.fromkeys((*(objectives or ("metric", "latency")), "size")))
    config = SearchConfig.load(
        args.search_config, pipeline=args.pipeline, max_drop=args.max_drop, sampler=args.sampler, seed=args.seed,
        objectives=objectives, runtimes=_split(args.runtimes), latency_budget=args.latency_budget,
        latency_batch=args.latency_batch, disabled=_split(args.disable), exports=args.exports,
        cache_mb=args.cache_mb,
    )
    if args.storage:
        validate_storage_url(args.storage)
    if track and args.tracking_uri:
        validate_tracking_uri(args.tracking_uri)
    return Search(spec, resolve_device(args.device), config, storage=args.storage,
                  tracking_uri=args.tracking_uri, track=track, name=name or args.study_name,
                  worker=getattr(args, "worker_index", None) or 0, extra_seeds=enqueued(getattr(args, "enqueue", [])),
                  allow_nondeterministic=args.allow_nondeterministic,
                  accept_plugin_change=getattr(args, "accept_plugin_change", False))


def enqueued(paths: list[str]) -> list[SeedRecipe]:
    """The seeds of ``--enqueue RECIPE`` files, named after their files."""
    seeds = []
    for path in paths:
        recipe = Recipe.load(path)
        seeds.append(SeedRecipe(name=Path(path).stem, runtime=recipe.runtime,
                                stages=tuple(c.to_dict() for c in recipe.stages)))
    return seeds


def cmd_optimize(args: argparse.Namespace) -> int:
    if args.trials < 1:
        raise ConfigError(f"--trials={args.trials}: must be >= 1 (the study's total number of trials)")
    if args.workers < 1:
        raise ConfigError(f"--workers={args.workers}: must be >= 1")
    set_threads(args.threads)
    spec = spec_from_args(args)
    search = build_search(args, spec, track=not args.no_tracking)
    console = make_console()
    console.print(threads_line(args.threads, search.device, args.workers), highlight=False)
    if args.worker_index is not None:  # one worker of a study that the parent process prepared
        return 130 if run_worker(search, args.trials, args.timeout, console) else 0
    launch = None
    if args.workers > 1:
        argv = getattr(args, "argv", None) or sys.argv[1:]
        launch = partial(launch_workers, argv, args.workers, console)
    outcome = run_search(search, args.trials, args.timeout, console, launch=launch,
                         started=getattr(args, "started", None))
    console.print(outcome.table)
    if search.config.exports == "pareto":
        console.print("exports: for the Pareto trials only, after the search (exports: pareto); "
                      "the table's exports column says which ran")
    for note in outcome.notes:
        console.print(f"note: {note}")
    if outcome.machine:
        console.print(outcome.machine, highlight=False, soft_wrap=True)
    if (started := getattr(args, "started", None)) is not None:
        outcome.times.wall = time.perf_counter() - started  # the whole command, from its start
    console.print(f"time: {outcome.times.describe()}")
    console.print(f"cache: {outcome.cache}")
    console.print(f"study {outcome.study_name} in {search.storage_label}")
    for line in front_files(outcome.recipes):
        console.print(line, highlight=False, soft_wrap=True)
    if outcome.tracking_uri:
        local = outcome.tracking_uri.startswith("sqlite:")
        console.print(f"MLflow: {mask_secrets(outcome.tracking_uri)}" + (" (make ui)" if local else ""))
    return 130 if outcome.interrupted else 0


def cmd_report(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    search = build_search(args, spec, track=False)
    names = search.study_names()
    if search.study_name not in names:
        mine = [n for n in names if n.startswith(f"{spec.name}-")]
        if args.study_name or len(mine) != 1:
            raise PipelineError(f"no study '{search.study_name}' in {search.storage_label}; "
                                f"studies of {spec.name} there: "
                                f"{', '.join(mine) or 'none'} (pass the optimize options you used, or --study-name)")
        search = build_search(args, spec, track=False, name=mine[0])
    study = search.open_study(create=False)
    rows = pareto_rows(study, search.objectives)
    if args.json:
        print(json.dumps([vars(r) for r in rows], indent=2))
        return 0
    states: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False, states=finished_states()):
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    counts = ", ".join(f"{v} {k.lower()}" for k, v in sorted(states.items()))
    console = make_console()
    stored = study.user_attrs.get(ATTR_BASELINE)
    baseline = Baseline(**stored) if stored is not None else None
    console.print(pareto_table(rows, search.objectives, f"{spec.name}: Pareto front of {search.study_name} ({counts})",
                               baseline, [FRONT_NOTE, "re-timed: the front timed again when the study ended"]))
    if machine := machine_line(study):
        console.print(machine, highlight=False, soft_wrap=True)
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    recipe = Recipe.load(args.recipe)
    spec = spec_from_args(args)
    if recipe.model and recipe.model != spec.name:
        raise ConfigError(f"recipe {args.recipe} was made for model '{recipe.model}', not '{spec.name}'")
    device = resolve_device(args.device)
    output = Path(args.output) if args.output else results_dir() / "apply" / Path(args.recipe).parent.name
    output.mkdir(parents=True, exist_ok=True)
    console = make_console()
    log = output / THIRD_PARTY_LOG  # as optimize does: the console keeps paretorch's own lines
    if not args.json:
        console.print(f"third-party warnings and progress bars: {log}", highlight=False, soft_wrap=True)
    with stderr_to(log):
        runner = Runner(recipe_pipeline(recipe.stages), spec, device, cache=NodeCache(export_dir=cache_dir("exports")),
                        latency=LATENCY_BUDGETS[args.latency_budget])
        result = runner.run({}, recipe.runtime, exports=not args.no_export)
    exports: dict[str, dict[str, Any]] = {}
    for name, export in result.exports.items():
        export = deliver(export, output)
        exports[name] = {"path": str(export.path), "size_bytes": export.size_bytes, "validation": export.validation,
                         **export.metrics}
    measured = recipe.metadata.get(RECORDED)
    summary = {"model": spec.name, "recipe": recipe.describe(), "device": result.report.device,
               "metrics": result.report.as_metrics(), "exports": exports, "recorded": measured}
    (output / "apply.json").write_text(json.dumps(summary, indent=2, default=str))
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    trial = recipe.metadata.get("trial")
    beside = recorded_cells(result.report, measured) if isinstance(measured, dict) else None
    console.print(evaluation_table(f"{spec.name}: {short_recipe(recipe.stages, recipe.runtime)}", result.report,
                                   beside, f"search (trial {trial})" if trial is not None else "search"))
    if beside is None:
        console.print("recorded: none in this recipe file (recipes saved before the search recorded its numbers)",
                      highlight=False)
    for name, info in exports.items():
        console.print(f"{name}: {info['path']} ({format_bytes(info['size_bytes'])}; {info['validation']})")
    console.print(f"written: {output / 'apply.json'}")
    return 0
