"""Command-line arguments shared by the commands that take a model."""

from __future__ import annotations

import argparse

from pipeline.core.spec import ModelSpec
from pipeline.sources import SourceOptions
from pipeline.sources.resolve import resolve_spec


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


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    """The ModelSpec named by ``--model`` (and any source options), resolved and checked."""
    options = SourceOptions(
        input_shape=getattr(args, "input_shape", None),
        inputs_file=getattr(args, "inputs_file", None),
        output_kind=getattr(args, "output_kind", "auto"),
        trust_pickle=getattr(args, "trust_pickle", False),
        eval_data=getattr(args, "eval_data", None),
    )
    return resolve_spec(args.model, options)
