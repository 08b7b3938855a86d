"""``python -m pipeline``: the command-line interface.

Every :class:`PipelineError` is printed as one ``error:`` line with exit code 2;
nothing the user mistyped produces a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from pipeline.cli.args import add_model_args, spec_from_args
from pipeline.cli.commands import add_nondeterministic_arg, add_threads_arg, register_search_commands, set_threads
from pipeline.core.device import resolve_device
from pipeline.core.errors import PipelineError
from pipeline.core.paths import set_results_dir
from pipeline.core.report import evaluation_table, print_table
from pipeline.core.runtimes.registry import get_runtime, runtime_names
from pipeline.core.secrets import mask_secrets
from pipeline.core.self_check import require_stable, self_check
from pipeline.core.spec import load_model
from pipeline.engine.graph import recipe_pipeline
from pipeline.engine.runner import Runner

EXIT_USER_ERROR = 2

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Command] = {}


def cmd_evaluate(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    device = resolve_device(args.device)
    get_runtime(args.runtime)  # an unknown name is one error line, before the model loads
    spec = spec_from_args(args)
    model = load_model(spec)
    line = require_stable(self_check(model, spec, device), spec.name, args.allow_nondeterministic, "evaluate")
    print(line, file=sys.stderr if args.json else sys.stdout)
    # Every runtime runs through the runner, as in a search (one that reads its export gets it made there).
    report = Runner(recipe_pipeline([]), spec, device, model=model).run({}, args.runtime, exports=False).report
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_table(evaluation_table(f"{spec.name}: unoptimized model", report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Optimize trained PyTorch models: prune, quantize, mixed precision and export, "
        "searched with Optuna for the best accuracy/latency trade-offs, tracked in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    evaluate = sub.add_parser("evaluate", help="measure the unoptimized model: metric, latency, memory, size, MACs",
                              description="Measure a model as it is: task metric, latency per batch size "
                              "(p50/p90), peak memory, serialized size, parameters and MACs.")
    add_model_args(evaluate)
    evaluate.add_argument("--runtime", default="eager", help=" | ".join(runtime_names()))
    evaluate.add_argument("--json", action="store_true", help="print the measurements as JSON")
    add_threads_arg(evaluate)
    add_nondeterministic_arg(evaluate)
    _COMMANDS["evaluate"] = cmd_evaluate

    # Later command groups register here: register_xyz(sub, _COMMANDS).
    register_search_commands(sub, _COMMANDS)
    return parser


def run(argv: Sequence[str] | None = None, started: float | None = None) -> NoReturn:
    """``python -m pipeline``: :func:`main`, then exit at once. The interpreter's last garbage collection walks
    every object that torch, MLflow and Optuna made (2 to 3 s on a loaded machine, after the last line is
    printed and everything is recorded); frozen, they are left to the operating system (atexit handlers still run)."""
    code = main(argv, started)
    sys.stdout.flush()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """Run one command; ``started``: its ``time.perf_counter()`` start (default: now), for its ``time:`` line."""
    started = time.perf_counter() if started is None else started
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what worker processes are started with
    args.started = started
    try:
        if getattr(args, "results_dir", None):
            set_results_dir(args.results_dir)
        return _COMMANDS[args.command](args)
    except PipelineError as exc:
        print(f"error: {mask_secrets(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
