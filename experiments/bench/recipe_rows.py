"""paretorch's own recipes timed the way the peers are: rows beside sentence-transformers' backends.

A peer row (:mod:`paretorch.experiments.bench.peers`) is one backend timed in rounds alternating with torch fp32
eager, on two sentence sets (the spec's latency batch at 32, repeated; sentences of the held-out dev
pairs), each batch padded to its own longest row. A *recipe row* is a paretorch recipe file (a study's
``recipe.json``, e.g. the search's best) replayed with the engine's runner and timed by the same
protocol in this process: the same sentence sets, batches, threads, warm-up passes, rounds and
alternating order; the baseline is the unoptimized model under torch eager on each batch at its own
length. A runtime that compiles for static shapes gets each batch padded to its length bucket
(:func:`paretorch.pipeline.core.padding.to_bucket`), as the search times it: the bucket's cost is in the row.
Task metric and held-out Spearman come from the recipe's own outputs under its runtime.

With the peers' corpus (every distinct held-out sentence), a recipe also gets a *corpus row*: the recipe deployed
as a user gets it, its ``encode`` of the whole list of strings (sorted by length, tokenization included) in rounds
alternating with torch fp32's ``SentenceTransformer(path).encode``, as each peer's ``encode`` is timed in its own
environment against the same reference (``"workload": "corpus"``, ``"end_to_end": true``).

Rows have ``"kind": "paretorch"`` and render in the peers' table.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from paretorch.experiments.bench.end_to_end import deployed
from paretorch.experiments.bench.peer_types import CorpusJob, PeerRow, SentenceSet
from paretorch.experiments.bench.peers_runner import encode_fn, time_rounds
from paretorch.experiments.models import minilm
from paretorch.pipeline.core.device import move_module, resolve_device
from paretorch.pipeline.core.evaluate import task_metric
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.padding import to_bucket
from paretorch.pipeline.core.runtimes.registry import get_runtime, prepare_runtime
from paretorch.pipeline.core.spec import Batch, ModelSpec, move_batch
from paretorch.pipeline.core.task_data import load_task_data
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.core.timing import clock_for, host_seconds
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.engine.short_recipe import short_recipe

#: The sentence set of the ``corpus`` rows: every distinct held-out sentence, embedded whole by ``encode()``.
CORPUS_SET = "dev corpus, encode()"

#: One pass of a model over a sentence set's token batches.
Pass = Callable[[], None]


def token_batches(sentences: Sequence[str], batch: int, repeat: int) -> list[Batch]:
    """``sentences`` cut into consecutive batches of ``batch``, each tokenized and padded to its longest
    row (as sentence-transformers pads), the list ``repeat`` times over."""
    batches = [minilm.encode_text(sentences[i : i + batch]) for i in range(0, len(sentences), batch)]
    return batches * repeat


def forward_pass(fn: Callable[..., Tensor], batches: Sequence[Batch], device: torch.device) -> Pass:
    """One pass of ``fn`` over ``batches`` (already on ``device``), waiting for the device at the end (its clock's
    wait: the timing service's)."""
    clock = clock_for(device)

    def run() -> None:
        with torch.no_grad():
            for inputs in batches:
                fn(*inputs)
        clock.wait()

    return run


def replay(recipe: Recipe, spec: ModelSpec, device: torch.device) -> Callable[..., Tensor]:
    """The recipe's model built by the engine's runner (the search's cache keys and resolved configs) and
    prepared for its runtime: a torch runtime wraps the module, an exported one opens its file."""
    runner = Runner(recipe_pipeline(recipe.model_stages()), spec, device)
    return runner.prepare({}, recipe.runtime)


def recipe_rows(paths: Sequence[Path], sets: dict[str, SentenceSet], settings: dict[str, int],
                held_out: Path | None, device_name: str = "cpu",
                corpus: CorpusJob | None = None) -> list[PeerRow]:
    """For each recipe file, one ``"kind": "paretorch"`` row per sentence set (``sets``: name ->
    ``{"sentences", "repeat"}``, the peers' job inputs), and with ``corpus`` (the peers' job corpus: its
    ``sentences`` and ``rounds``) one more: the recipe deployed (:func:`corpus_timings`)."""
    device = resolve_device(device_name)
    spec = minilm.spec()
    mask = spec.padding_mask
    assert mask is not None
    baseline_fn = prepare_runtime(move_module(spec.build(), device).eval(), "eager", device)
    held_spec = with_task_data(spec, load_task_data(str(held_out))) if held_out is not None else None
    # Scored as evaluate_model scores (paretorch.pipeline.core.evaluate.task_metric): a compiled runtime in chunks of
    # the rows' batch, in one length bucket.
    chunk = (settings["batch"],)
    baseline_metric = task_metric(baseline_fn, spec, device, "eager", chunk)
    baseline_held = task_metric(baseline_fn, held_spec, device, "eager", chunk) if held_spec else None
    rows: list[PeerRow] = []
    for path in paths:
        recipe = Recipe.load(path)
        started = host_seconds()
        fn = replay(recipe, spec, device)
        static = get_runtime(recipe.runtime).static_shapes
        common: PeerRow = {"kind": "paretorch",
                           "name": f"paretorch: {short_recipe(recipe.model_stages(), recipe.runtime)}",
                           "recipe_file": str(path), "how": f"python -m paretorch apply --recipe {path.name}",
                           "prepare_seconds": host_seconds() - started}
        metric = task_metric(fn, spec, device, recipe.runtime, chunk)
        held = task_metric(fn, held_spec, device, recipe.runtime, chunk) if held_spec else None
        for name, inputs in sets.items():
            own = [move_batch(b, device) for b in token_batches(inputs["sentences"], settings["batch"],
                                                                inputs["repeat"])]
            timed = [to_bucket(b, mask) for b in own] if static else own
            # The peers' protocol (the runner's time_rounds): warm-up passes, then rounds alternating who goes first.
            rounds = time_rounds(forward_pass(baseline_fn, own, device), forward_pass(fn, timed, device),
                                 settings["rounds"], settings["warmup"])
            ratios = [b / r for b, r in zip(rounds["baseline_s"], rounds["peer_s"], strict=True)]
            count = len(own)
            rows.append({
                **common, "inputs": name, "speedup": statistics.median(ratios), "ci": list(median_ci(ratios)),
                "peer_ms": 1000 * statistics.median(rounds["peer_s"]) / count,
                "baseline_ms": 1000 * statistics.median(rounds["baseline_s"]) / count, "rounds": len(ratios),
                "batches": count // inputs["repeat"],
                "longest": [int(b[mask].shape[1]) for b in own[: count // inputs["repeat"]]],
                "timed_widths": sorted({int(b[mask].shape[1]) for b in timed}),
                "mean_tokens": float(torch.cat([b[mask].sum(dim=1) for b in own]).float().mean()),
                "metric": metric, "baseline_metric": baseline_metric,
                "held_out": held, "baseline_held_out": baseline_held,
                "precision": None,
            })
        if corpus is not None:
            timings = corpus_timings(recipe, spec, device, corpus["sentences"], settings["batch"], corpus["rounds"])
            rows.append({**common, "name": f"{common['name']} (deployed)",
                         **corpus_row(timings, corpus["sentences"], settings["batch"]), "metric": metric,
                         "baseline_metric": baseline_metric, "held_out": held, "baseline_held_out": baseline_held,
                         "precision": None})
    return rows


def corpus_timings(recipe: Recipe, spec: ModelSpec, device: torch.device, sentences: Sequence[str], batch: int,
                   rounds: int) -> dict[str, list[float]]:
    """The recipe deployed as a user gets it (its ``deploy/`` folder written and loaded with
    :func:`paretorch.pipeline.api.load_deployment`), its ``encode`` of the whole list of strings timed in rounds
    alternating with torch fp32's ``SentenceTransformer(path).encode`` (the peers' corpus protocol, in this process)."""
    from sentence_transformers import SentenceTransformer  # the peers' reference, in this environment too

    baseline = SentenceTransformer(str(minilm.model_dir()), device=str(device)).float()
    texts = list(sentences)
    with tempfile.TemporaryDirectory() as folder:
        encoder = deployed(spec, recipe, Path(folder) / "deploy", device)
        return time_rounds(encode_fn(baseline, texts, batch), lambda: encoder.encode(texts, batch), rounds, 1)


def corpus_row(timings: dict[str, list[float]], sentences: Sequence[str], batch: int) -> PeerRow:
    """A corpus row's timing: ``encode()`` of the whole list against torch fp32's ``encode()`` in the same rounds."""
    batches = -(-len(sentences) // batch)
    tokens = torch.cat([minilm.encode_text(sentences[i : i + 256])[1].sum(dim=1)
                        for i in range(0, len(sentences), 256)])
    ratios = [b / r for b, r in zip(timings["baseline_s"], timings["peer_s"], strict=True)]
    return {"inputs": CORPUS_SET, "workload": "corpus", "end_to_end": True, "batch": batch,
            "speedup": statistics.median(ratios), "ci": list(median_ci(ratios)),
            "peer_ms": 1000 * statistics.median(timings["peer_s"]) / batches,
            "baseline_ms": 1000 * statistics.median(timings["baseline_s"]) / batches, "rounds": len(ratios),
            "batches": batches, "sentences": len(sentences),
            "sentences_per_s": len(sentences) / statistics.median(timings["peer_s"]),
            "longest": [int(tokens.max())], "mean_tokens": float(tokens.float().mean())}
