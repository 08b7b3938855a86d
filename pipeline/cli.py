"""``python -m pipeline``: the command-line interface.

Every :class:`PipelineError` is printed as one ``error:`` line with exit code 2;
nothing the user mistyped produces a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pipeline.commands import register_search_commands
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.spec import ModelSpec

EXIT_USER_ERROR = 2

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Command] = {}


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
    parser.add_argument("--output-kind", default="auto", choices=("auto", "logits", "embedding"),
                        help="TorchScript/.pt2/hf: models: how fidelity is measured: logits -> top-1 agreement, "
                        "embedding -> mean cosine; auto: logits for a 2-D output whose rows are not unit-norm")


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    """The ModelSpec named by ``--model`` (and any source options), resolved and checked."""
    from pipeline.resolve import resolve_spec
    from pipeline.sources import SourceOptions

    options = SourceOptions(
        input_shape=getattr(args, "input_shape", None),
        inputs_file=getattr(args, "inputs_file", None),
        output_kind=getattr(args, "output_kind", "auto"),
    )
    return resolve_spec(args.model, options)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from pipeline.device import resolve_device
    from pipeline.evaluate import evaluate_model
    from pipeline.report import evaluation_table, print_table
    from pipeline.resolve import load_model

    device = resolve_device(args.device)
    spec = spec_from_args(args)
    model = load_model(spec)
    report = evaluate_model(model, spec, device, runtime=args.runtime)
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
    evaluate.add_argument("--runtime", default="eager", help="eager | compile | compile_cudagraphs")
    evaluate.add_argument("--json", action="store_true", help="print the measurements as JSON")
    _COMMANDS["evaluate"] = cmd_evaluate

    # Later command groups register here: register_xyz(sub, _COMMANDS).
    register_search_commands(sub, _COMMANDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "results_dir", None):
        from pipeline.paths import set_results_dir

        set_results_dir(args.results_dir)
    try:
        return _COMMANDS[args.command](args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
