"""What the commands of ``python -m paretorch`` do, once :mod:`paretorch.pipeline.cli.parser` has checked their options.

* ``evaluate``: measure the unoptimized model;
* ``optimize``: run (or resume) the study, log it to MLflow, print the Pareto table;
* ``report``: print the Pareto table of a study again, from its storage alone;
* ``apply --recipe FILE``: replay one recipe (same stages, same exports) through
  the same runner: the scripted-reuse path for CI jobs; and the files a deployment loads its callable from, in
  ``<output>/deploy/`` (:mod:`paretorch.pipeline.engine.deployment`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from paretorch.pipeline.cli.args import spec_from_args
from paretorch.pipeline.cli.checks import search_overrides
from paretorch.pipeline.core.device import resolve_device
from paretorch.pipeline.core.errors import ConfigError, PipelineError
from paretorch.pipeline.core.evaluate import Known
from paretorch.pipeline.core.input_agreement import Reference
from paretorch.pipeline.core.input_agreement import describe as describe_inputs
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.paired import free_cores, load_average, usable_cores
from paretorch.pipeline.core.paths import cache_dir, results_dir
from paretorch.pipeline.core.progress import say
from paretorch.pipeline.core.report import evaluation_table, format_bytes, print_table
from paretorch.pipeline.core.runtimes.registry import get_runtime
from paretorch.pipeline.core.secrets import mask_secrets
from paretorch.pipeline.core.self_check import reference_outputs, require_stable, self_check
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.deliver import deliver
from paretorch.pipeline.engine.deployment import DEPLOY_DIR, save_deployment
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.engine.short_recipe import short_recipe
from paretorch.pipeline.search import LATENCY_BUDGETS, Search, SearchConfig, SeedRecipe, run_search
from paretorch.pipeline.search.config import finished_states
from paretorch.pipeline.search.finish import front_files
from paretorch.pipeline.search.front import machine_line
from paretorch.pipeline.search.loop import THIRD_PARTY_LOG, run_worker
from paretorch.pipeline.search.objectives import ATTR_BASELINE, Baseline
from paretorch.pipeline.search.pareto import FRONT_NOTE, pareto_rows, pareto_table
from paretorch.pipeline.search.quiet import stderr_to
from paretorch.pipeline.search.recorded import RECORDED, recorded_cells
from paretorch.pipeline.search.workers import launch_workers

Command = Callable[[argparse.Namespace], int]


def cmd_evaluate(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    device = resolve_device(args.device)
    get_runtime(args.runtime)  # an unknown name is one error line, before the model loads
    spec = spec_from_args(args)
    model = load_model(spec)
    out = sys.stderr if args.json else sys.stdout  # --json: standard output holds the JSON alone
    # One pass of the model over the evaluation set: the self-check's first scoring, and the eager report's metrics.
    reference = reference_outputs(model, spec, device)
    line = require_stable(self_check(model, spec, device, out, reference=reference), spec.name,
                          args.allow_nondeterministic, "evaluate")
    say(Console(file=out), line)
    # Every runtime runs through the runner, as in a search (a file runtime exports and opens its file).
    runner = Runner(recipe_pipeline([]), spec, device, latency=LATENCY_BUDGETS[args.latency_budget], model=model)
    known = Known(outputs=reference) if args.runtime == DEFAULT_RUNTIME else Known()
    report = runner.run({}, args.runtime, exports=False, known=known).report
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_table(evaluation_table(f"{spec.name}: unoptimized model", report))
    return 0


def set_threads(threads: int | None) -> None:
    if threads is None:
        return
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


def make_console() -> Console:
    """A rich console; wide when writing to a file or pipe (make, CI logs) so tables do not fold."""

    return Console() if sys.stdout.isatty() else Console(width=200)


def build_search(args: argparse.Namespace, spec: ModelSpec, track: bool = True, name: str | None = None) -> Search:
    """The :class:`Search` that the CLI options describe (``name``: this study, not the one they name); the config,
    the storage URL and the tracking URI were checked before torch loaded (:mod:`paretorch.pipeline.cli.checks`)."""
    config = SearchConfig.load(args.search_config, **search_overrides(args))
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
    set_threads(args.threads)
    spec = spec_from_args(args)
    search = build_search(args, spec, track=not args.no_tracking)
    console = make_console()
    console.print(threads_line(args.threads, search.plan.device, args.workers), highlight=False)
    if args.worker_index is not None:  # one worker of a study that the parent process prepared
        return 130 if run_worker(search, args.trials, args.timeout, console) else 0
    launch = None
    if args.workers > 1:
        argv = getattr(args, "argv", None) or sys.argv[1:]
        launch = partial(launch_workers, argv, args.workers, console)
    outcome = run_search(search, args.trials, args.timeout, console, launch=launch,
                         started=getattr(args, "started", None))
    console.print(outcome.table)
    if search.plan.config.exports == "pareto":
        console.print("exports: for the Pareto trials only, after the search (exports: pareto); "
                      "the table's exports column says which ran")
    for note in outcome.notes:
        console.print(f"note: {note}")
    if outcome.machine:
        say(console, outcome.machine)
    if outcome.found:
        say(console, outcome.found)
    if (started := getattr(args, "started", None)) is not None:
        outcome.times.wall = time.perf_counter() - started  # the whole command, from its start
    console.print(f"time: {outcome.times.describe()}")
    console.print(f"cache: {outcome.cache}")
    console.print(f"study {outcome.study_name} in {search.store.label}")
    for line in front_files(outcome.recipes, outcome.best):
        say(console, line)
    if outcome.tracking_uri:
        local = outcome.tracking_uri.startswith("sqlite:")
        console.print(f"MLflow: {mask_secrets(outcome.tracking_uri)}" + (" (make ui)" if local else ""))
    return 130 if outcome.interrupted else 0


def cmd_report(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    search = build_search(args, spec, track=False)
    names = search.store.study_names()
    if search.store.study_name not in names:
        mine = [n for n in names if n.startswith(f"{spec.name}-")]
        if args.study_name or len(mine) != 1:
            raise PipelineError(f"no study '{search.store.study_name}' in {search.store.label}; "
                                f"studies of {spec.name} there: "
                                f"{', '.join(mine) or 'none'} (pass the optimize options you used, or --study-name)")
        search = build_search(args, spec, track=False, name=mine[0])
    study = search.store.open_study(create=False)
    rows = pareto_rows(study, search.plan.objectives)
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
    console.print(pareto_table(rows, search.plan.objectives,
                               f"{spec.name}: Pareto front of {search.store.study_name} ({counts})",
                               baseline, [FRONT_NOTE, "re-timed: the front timed again when the study ended"]))
    if machine := machine_line(study):
        say(console, machine)
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
        say(console, f"third-party warnings and progress bars: {log}")
    with stderr_to(log):
        runner = Runner(recipe_pipeline(recipe.stages), spec, device, cache=NodeCache(export_dir=cache_dir("exports")),
                        latency=LATENCY_BUDGETS[args.latency_budget])
        # The replay against the unoptimized model input by input, as a search trial is (its tail in apply.json).
        runner.reference = cache(lambda: Reference.of(reference_outputs(runner.model, spec, device)[0],
                                                      spec.output_kind))
        result = runner.run({}, recipe.runtime, exports=not args.no_export)
    exports: dict[str, dict[str, Any]] = {}
    for name, export in result.exports.items():
        export = deliver(export, output)
        exports[name] = {"path": str(export.path), "size_bytes": export.size_bytes, "validation": export.validation,
                         **export.metrics}
    deploy = output / DEPLOY_DIR
    shipped = runner.runtime_file({}, recipe.runtime)
    deployment = {"path": str(deploy), **save_deployment(result.model, result.recipe(spec.name), deploy, shipped)}
    measured = recipe.metadata.get(RECORDED)
    summary = {"model": spec.name, "recipe": recipe.describe(), "device": result.report.device,
               "metrics": result.report.as_metrics(), "exports": exports, "deployment": deployment,
               "recorded": measured, "worst_inputs": list(result.report.worst_inputs)}
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
    if deployment:
        held = deployment.get("weights") or deployment["file"]
        console.print(f"deployment: {deploy} ({held} + {deployment['recipe']}; "
                      "paretorch.pipeline.api.load_deployment rebuilds its callable)", highlight=False)
    if inputs := describe_inputs(result.report.extra):
        console.print(f"{inputs} against the unoptimized model (the worst in apply.json)", highlight=False)
    console.print(f"written: {output / 'apply.json'}")
    return 0


#: Every command, by the name the parser gives it.
COMMANDS: dict[str, Command] = {"evaluate": cmd_evaluate, "optimize": cmd_optimize, "report": cmd_report,
                                "apply": cmd_apply}
