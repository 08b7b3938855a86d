"""The command line of ``python -m paretorch``: every option of every command, parsed and checked without torch.

:func:`parse_args` runs before any module that imports torch, MLflow or Optuna is loaded
(:mod:`paretorch.pipeline.cli.main` imports :mod:`paretorch.pipeline.cli.commands` only after it), so a mistyped
option, number or name costs a fraction of a second of CPU, not the seconds torch's
import takes. The files, configs and stores the options name are checked next, still without torch
(:mod:`paretorch.pipeline.cli.checks`); what only torch can tell (a device present here, the model itself) the
commands check.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.names import (
    ALLOW_FLAG,
    DEFAULT_LATENCY_BUDGET,
    DEFAULT_RUNTIME,
    LATENCY_BUDGET_NAMES,
    WORKER_FLAG,
    WORKLOADS,
    device_name,
    runtime_names,
    unknown_runtime,
    unknown_runtimes,
)
from paretorch.pipeline.core.version import VERSION

#: Options whose value must be at least 1: the attribute, the flag, what it counts.
POSITIVE = (("trials", "--trials", "the study's total number of trials"), ("workers", "--workers", None),
            ("threads", "--threads", None), ("latency_batch", "--latency-batch", None),
            ("cache_mb", "--cache-mb", None))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paretorch",
        description="Optimize trained PyTorch models: prune, quantize, mixed precision and export, "
        "searched with Optuna for the best accuracy/latency trade-offs, tracked in MLflow.",
    )
    parser.add_argument("--version", action="version", version=f"paretorch {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    evaluate = sub.add_parser("evaluate", help="measure the unoptimized model: metric, latency, memory, size, MACs",
                              description="Measure a model as it is: task metric, latency per batch size "
                              "(p50/p90), peak memory, serialized size, parameters and MACs.")
    add_model_args(evaluate)
    evaluate.add_argument("--runtime", default=DEFAULT_RUNTIME, help=" | ".join(runtime_names()))
    add_latency_budget_arg(evaluate)
    evaluate.add_argument("--json", action="store_true", help="print the measurements as JSON")
    add_threads_arg(evaluate)
    add_nondeterministic_arg(evaluate)

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
                          help="queue this recipe file as a trial, after the baseline, the first presets and the "
                               "config's seeds (repeatable; skipped if already run)")
    optimize.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    optimize.add_argument("--workers", type=int, default=1,
                          help="run the study in this many processes on this machine (default 1); more machines: "
                          "run optimize on each with one --storage postgresql://... and --tracking-uri http://...")
    optimize.add_argument(WORKER_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    add_threads_arg(optimize)

    report = sub.add_parser("report", help="print a study's Pareto table again, from its storage",
                            description="Print the Pareto table of the study that the same optimize options name "
                            "(or --study-name), read back from the Optuna storage.")
    add_model_args(report)
    add_search_args(report)
    report.add_argument("--json", action="store_true", help="print the Pareto rows as JSON")
    add_threads_arg(report)  # accepted (and unused) so that make's ARGS work for optimize and report alike

    apply = sub.add_parser("apply", help="replay one recipe: same stages, same exports, measured",
                           description="Replay a recipe file (from a study's Pareto trials) on the model: apply its "
                           "stages, measure the result, write its exports. For scripts and CI jobs.")
    add_model_args(apply)
    apply.add_argument("--recipe", required=True,
                       help="a recipe JSON file (runs/studies/<study>/trial-NNN/recipe.json)")
    apply.add_argument("--output", default=None, help="where the exports, apply.json and (pack recipes) deploy/ go "
                       "(default: <results>/apply/<recipe name>)")
    apply.add_argument("--no-export", action="store_true", help="apply and measure only; skip the exports")
    add_latency_budget_arg(apply)
    apply.add_argument("--json", action="store_true", help="print the measurements and exports as JSON")
    add_threads_arg(apply)
    return parser


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Arguments every model-handling command takes."""
    parser.add_argument("--model", "-m", required=True,
                        help="built-in name (e.g. digits, minilm), path/file.py:attr, package.module:attr, "
                        "a TorchScript file (model.pt), a torch.export file (model.pt2) or hf:path/to/local/dir")
    parser.add_argument("--device", default="auto", help="auto (mps, then cuda, then cpu) | mps | cuda | cpu")
    parser.add_argument("--results-dir", default=None,
                        help="where everything is written (default: runs/, or $PARETORCH_RESULTS_DIR)")
    parser.add_argument("--input-shape", default=None, metavar="SHAPE",
                        help="TorchScript/.pt2 models: shape of one input batch, e.g. 1x3x224x224 (several inputs: "
                        "1x3x224x224,1x10); the batch dimension is replaced; float32 inputs are generated")
    parser.add_argument("--inputs-file", default=None, metavar="PATH",
                        help="TorchScript/.pt2 models: a .pt file of a tensor or tuple of tensors (batch first); "
                        "hf: models: a UTF-8 text file, one input per line")
    parser.add_argument("--eval-data", default=None, metavar="PATH",
                        help="labelled evaluation data, for any model: judge by the task metric instead of fidelity. "
                        "A .tsv/.csv/.jsonl table with text,label (classification: accuracy) or sentence1,sentence2,"
                        "score (pairs: Spearman x 100), a .pt file {'inputs', 'labels'} (tensor classification) or "
                        "a BEIR directory (retrieval: nDCG@10). See docs/metrics-and-task-data.md")
    parser.add_argument("--output-kind", default="auto", choices=("auto", "logits", "embedding"),
                        help="TorchScript/.pt2/hf: models: how fidelity is measured: logits -> top-1 agreement, "
                        "embedding -> mean cosine; auto: logits for a 2-D output whose rows are not unit-norm")
    parser.add_argument("--trust-pickle", action="store_true",
                        help=".pt2 models: load archives whose weights or constants are pickled, which runs code "
                        "from the file: only for files from a trusted author")


def add_nondeterministic_arg(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(ALLOW_FLAG, action="store_true",
                        help="go on when the unoptimized model scores differently twice or at another batch size "
                        "(a model that keeps state between calls or is nondeterministic); the run says by how much")


def add_latency_budget_arg(parser: argparse.ArgumentParser) -> None:
    """``--latency-budget`` of a command that times one model (evaluate, apply); a search's is among its options."""
    parser.add_argument("--latency-budget", default=DEFAULT_LATENCY_BUDGET, choices=LATENCY_BUDGET_NAMES,
                        help=f"how long each batch size is timed (default {DEFAULT_LATENCY_BUDGET}; docs/latency.md)")


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice). On a loaded machine, 1 thread "
                        "gives steadier latencies than several threads waiting on each other")


def add_search_args(parser: argparse.ArgumentParser) -> None:
    """Options that name a study (shared by ``optimize`` and ``report``); unset ones come from the search config."""
    group = parser.add_argument_group("search (defaults from paretorch/pipeline/defaults/search.yaml)")
    group.add_argument("--search-config", default=None, metavar="YAML", help="a search config file")
    add_nondeterministic_arg(group)
    group.add_argument("--pipeline", default=None,
                       help="default, a name in pipeline/defaults/pipelines/ or a YAML path")
    group.add_argument("--max-drop", default=None, metavar="DROP",
                       help="allowed metric drop vs the unoptimized model: absolute (0.01) or a percentage of "
                       "the baseline metric (1%%) (default 1%%, or the search config's)")
    group.add_argument("--tail-limit", default=None, metavar="SHARE",
                       help="the tail guard: a trial is infeasible when more than this share of the evaluation "
                       "inputs break against the unoptimized model (an embedding below --tail-cosine, a confident "
                       "class flipped): 1%%, 0.02 or off (default 1%%)")
    group.add_argument("--tail-cosine", type=float, default=None, metavar="COS",
                       help="where an embedding input breaks: its cosine to the unoptimized output (default 0.9)")
    group.add_argument("--sampler", default=None, choices=("tpe", "nsga2", "random"))
    group.add_argument("--seed", type=int, default=None, help="sampler seed")
    group.add_argument("--objectives", default=None, help="comma list of metric,latency,size (default metric,latency)")
    group.add_argument("--minimize-size", action="store_true", help="add the serialized size as a third objective")
    group.add_argument("--runtimes", default=None, help="comma list of runtimes to search (eager,compile,...)")
    group.add_argument("--workload", default=None, choices=WORKLOADS,
                       help="what latency is timed on, as the model will be used: serve (batches of raw inputs, "
                       "strings for a text model, to host outputs, in the given order), corpus (one list encoded "
                       "whole, sorted by length: throughput) or model (the model call alone on the device batch) "
                       "(default serve; docs/latency.md)")
    group.add_argument("--latency-budget", default=None, choices=LATENCY_BUDGET_NAMES,
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


def split_list(text: str | None) -> tuple[str, ...] | None:
    """A comma list option (``--runtimes eager,compile``) as names; None when not given."""
    return tuple(p.strip() for p in text.split(",") if p.strip()) if text else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line (argparse exits with its usage and ``error:`` line on a malformed one)."""
    return build_parser().parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Each option on its own: numbers in range, device and runtime names (the files and configs they name:
    :func:`paretorch.pipeline.cli.checks.check_inputs`). A problem is a
    :class:`~paretorch.pipeline.core.errors.PipelineError` (one ``error:`` line, exit code 2)."""
    for attr, flag, meaning in POSITIVE:
        value = getattr(args, attr, None)
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value}: must be >= 1" + (f" ({meaning})" if meaning else ""))
    args.device = device_name(args.device)
    if getattr(args, "runtime", None) is not None and args.runtime not in runtime_names():
        raise unknown_runtime(args.runtime)
    if (problem := unknown_runtimes(split_list(getattr(args, "runtimes", None)) or ())) is not None:
        raise ConfigError(f"--runtimes: {problem}")
