"""The peers benchmark: pinned environment specs, the dev-sentence reader, rows and their rendering.

No test here creates a virtual environment or needs the network: the runner's result is written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from paretorch.experiments.bench import isa, peer_envs, peers, peers_runner
from paretorch.experiments.bench.render import render_markdown
from paretorch.experiments.data.sts_benchmark import convert
from paretorch.experiments.models import minilm
from paretorch.pipeline.core.padding import latency_inputs
from paretorch.pipeline.core.task_data import PairsData, load_task_data

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("family", peer_envs.FAMILIES)
def test_every_peer_requirement_is_an_exact_pin(family: str) -> None:
    """Each family's file pins every distribution exactly, torch to the project's CPU build, the family's
    packages included; the OpenVINO file leaves out PyPI's CUDA torchvision."""
    lines = peer_envs.requirements(peer_envs.requirements_file(family))
    assert lines and peer_envs.loose(lines) == []
    names = {line.split("==")[0].lower() for line in lines}
    assert len(names) == len(lines)  # one pin a distribution
    project_torch = next(line for line in (REPO / "constraints.txt").read_text().splitlines()
                         if line.startswith("torch=="))
    assert project_torch in lines
    assert {"sentence-transformers", "transformers", "numpy"} <= names
    assert ({"onnxruntime", "optimum-onnx"} if family == "onnx" else {"openvino", "nncf", "optimum-intel"}) <= names
    assert "torchvision" not in names


def test_loose_requirements_are_caught(tmp_path: Path) -> None:
    path = tmp_path / "reqs.txt"
    path.write_text("# comment\ntorch==2.13.0+cpu\nfoo>=1.0\nbar\nbaz[extra]==2.0  # trailing\nqux==1.*\n\n")
    lines = peer_envs.requirements(path)
    assert lines == ["torch==2.13.0+cpu", "foo>=1.0", "bar", "baz[extra]==2.0", "qux==1.*"]
    assert peer_envs.loose(lines) == ["foo>=1.0", "bar", "qux==1.*"]
    with pytest.raises(ValueError, match="unknown peer family"):
        peer_envs.requirements_file("tensorrt")


def test_the_bench_and_the_runner_name_the_same_peers() -> None:
    assert peers.PEER_NAMES == peers_runner.FAMILIES
    assert tuple(peers.PEER_NAMES) == peer_envs.FAMILIES


def _pairs(tmp_path: Path, count: int = 40) -> PairsData:
    raw = tmp_path / "raw.tsv"
    rows = [f"news\tsrc\t2012\t{i:04d}\t{i % 5}.0\tSentence {i} says \"hi\".\tOther {i % 7} line.\n"
            for i in range(count)]
    raw.write_text("".join(rows), encoding="utf-8")
    convert(raw, tmp_path / "pairs.tsv")
    data = load_task_data(str(tmp_path / "pairs.tsv"))
    assert isinstance(data, PairsData)
    return data


def test_dev_sentences_are_distinct_fixed_and_read_with_quoting_off(tmp_path: Path) -> None:
    """Both sides of the pairs, each sentence once (quotes are text), in one fixed shuffled order."""
    data = _pairs(tmp_path)
    chosen = peers.dev_sentences(data, 30)
    assert len(chosen) == len(set(chosen)) == 30
    assert chosen == peers.dev_sentences(data, 30)
    assert 'Sentence 3 says "hi".' in data.first
    assert set(chosen) <= set(data.first) | set(data.second)
    assert chosen != sorted(chosen, key=[*data.first, *data.second].index)  # shuffled, not file order
    distinct = len(set(data.first) | set(data.second))  # 40 + 7
    with pytest.raises(ValueError, match=f"only {distinct} distinct sentences"):
        peers.dev_sentences(data, distinct + 1)


def test_pairs_score_reads_the_embeddings_in_distinct_text_order(tmp_path: Path) -> None:
    data = PairsData("mem", ("a", "a", "b"), ("b", "c", "c"), (3.0, 1.0, 2.0))
    # distinct order a, b, c: cos(a,b) > cos(b,c) > cos(a,c) ranks the pairs as the scores do
    embeddings = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]], dtype=np.float32)
    assert peers.pairs_score(data, embeddings) == pytest.approx(100.0)
    assert peers.pairs_score(data, embeddings[[2, 1, 0]]) == pytest.approx(50.0)  # another order, another score
    with pytest.raises(ValueError, match="2 embeddings for 3 distinct texts"):
        peers.pairs_score(data, embeddings[:2])


def test_speedup_is_the_median_round_ratio() -> None:
    ratio, (low, high) = peers.speedup([2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [1.0] * 9)
    assert ratio == 2.0 and low <= ratio <= high


def test_rounds_alternate_which_side_runs_first() -> None:
    calls: list[str] = []
    timed = peers_runner.time_rounds(lambda: calls.append("b"), lambda: calls.append("p"), rounds=3, warmup=1)
    assert calls == ["b", "p", "b", "p", "p", "b", "b", "p"]
    assert len(timed["baseline_s"]) == len(timed["peer_s"]) == 3
    assert peers_runner.batches(list("abcde"), 2) == [["a", "b"], ["c", "d"], ["e"]]


def _runner_result(tmp_path: Path, texts: int, held: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)

    def saved(name: str, rows: int) -> str:
        path = tmp_path / f"{name}.npy"
        np.save(path, rng.standard_normal((rows, 8)).astype(np.float32))
        return str(path)

    timings = {"baseline_s": [2.0] * 9, "peer_s": [1.0] * 9}
    return {
        "versions": {"openvino": "2026.4.1"}, "python": "3.11.7", "threads": 1, "torch_threads": 1,
        "affinity": [1], "isa": "avx512_vnni", "repeat": {peers.LATENCY_SET: 4, peers.DEV_SET: 1},
        "shapes": {peers.LATENCY_SET: [[32, 52]], peers.DEV_SET: [[32, 39], [32, 30]]},
        "tokens": {peers.LATENCY_SET: [32 * 27], peers.DEV_SET: [32 * 17, 32 * 15]},
        "baseline": {"embeddings": {"task": saved("t", texts), "held_out": saved("th", held)}},
        "peers": [
            {"name": "OpenVINO default", "how": 'SentenceTransformer(path, backend="openvino")',
             "file": "openvino/openvino_model.xml", "prepare_seconds": 3.0,
             "openvino": {"INFERENCE_PRECISION_HINT": "bf16"},
             "embeddings": {"task": saved("p", texts), "held_out": saved("ph", held)},
             "timings": {peers.LATENCY_SET: timings, peers.DEV_SET: timings}},
            {"name": "OpenVINO + NNCF static int8", "error": "RuntimeError: no calibration"},
        ],
    }


def test_peer_rows_and_their_rendering(tmp_path: Path) -> None:
    """A row per peer and sentence set with ``"kind": "peer"``, metrics from the embeddings, ms per batch
    from the round seconds; a failed peer's rows say why; BENCHMARKS.md gets the section."""
    task = PairsData("words", ("a", "b", "c"), ("d", "e", "f"), (1.0, 2.0, 3.0))
    held = _pairs(tmp_path)
    held_texts = len(set(held.first) | set(held.second))
    result = _runner_result(tmp_path, 6, held_texts)
    spec: dict[str, Any] = {"inputs": {peers.LATENCY_SET: {}, peers.DEV_SET: {}}}
    rows = peers.peer_rows("openvino", result, task, held, spec)
    assert [(r["name"], r["inputs"]) for r in rows] == [
        ("OpenVINO default", peers.LATENCY_SET), ("OpenVINO default", peers.DEV_SET),
        ("OpenVINO + NNCF static int8", peers.LATENCY_SET), ("OpenVINO + NNCF static int8", peers.DEV_SET)]
    assert all(r["kind"] == "peer" and r["family"] == "openvino" for r in rows)
    latency, dev, failed, _ = rows
    assert latency["speedup"] == 2.0 and latency["peer_ms"] == pytest.approx(250.0)  # 1 s / (1 batch x 4)
    assert dev["peer_ms"] == pytest.approx(500.0) and dev["longest"] == [39, 30]
    assert dev["mean_tokens"] == pytest.approx(16.0) and latency["precision"] == "bf16"
    assert -100 <= latency["metric"] <= 100 and latency["held_out"] is not None
    assert latency["metric"] != latency["baseline_metric"]  # each from its own embeddings
    assert failed["error"] == "RuntimeError: no calibration" and "speedup" not in failed
    rendered = peers.render({"model": "minilm", "batch": 32, "date": "d", "threads": 1, "affinity": [1],
                             "cpu": "x86_64", "uptime_before": "u", "uptime_after": "v", "metric_name": "m",
                             "held_out": "dev.tsv", "rows": rows, "runs": {"openvino": result}})
    assert "| OpenVINO default | latency sample (52 / 27.0) | 2.00x" in rendered
    assert "| OpenVINO + NNCF static int8 | dev sentences | did not run |" in rendered
    assert "RuntimeError: no calibration" in rendered and "openvino 2026.4.1" in rendered
    results = tmp_path / "results"
    results.mkdir()
    (results / f"{peers.PEERS_PREFIX}minilm-cpu.json").write_text(json.dumps(
        {"model": "minilm", "batch": 32, "date": "d", "threads": 1, "affinity": [1], "cpu": "x86_64",
         "uptime_before": "u", "uptime_after": "v", "metric_name": "m", "held_out": None, "rows": rows}))
    assert "### Peers: sentence-transformers' own CPU backends, minilm" in render_markdown(results)


def test_a_family_that_cannot_run_says_why_in_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_env(family: str, envs_dir: Path) -> Path:
        raise peer_envs.PeerEnvError(f"pip install -r {family}.txt failed (exit 1): no network")

    monkeypatch.setattr(peers, "ensure", no_env)
    monkeypatch.setattr(peers, "job", lambda family, work, held, settings: {
        "inputs": {peers.LATENCY_SET: {}}, "work_dir": str(work), "out": str(work / "r.json")})
    measured = peers.measure(["onnx"], None, tmp_path, tmp_path, {})
    assert [r["name"] for r in measured["rows"]] == list(peers.PEER_NAMES["onnx"])
    assert all(r["kind"] == "peer" and "no network" in r["error"] for r in measured["rows"])


def test_the_cpu_is_described_by_the_flags_the_peers_choose_by(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512_vnni amx_bf16\n\n"
                       "processor\t: 1\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512_vnni amx_bf16\n")
    assert isa.cpu_description(cpuinfo) == "Some Xeon (amx_bf16, avx512_vnni, avx2)"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t: fpu avx2\n")
    assert isa.cpu_description(cpuinfo) == "AMD EPYC (avx2; no AMX)"


def test_the_latency_set_is_the_specs_latency_batch() -> None:
    """The peers time the sentences of the batch the pipeline times: padded as sentence-transformers pads
    them, they are exactly the spec's latency batch at 32 (token ids, mask and length)."""
    sentences = peers.latency_sentences(32)
    assert len(sentences) == 32 and set(sentences) <= set(minilm.sentences("evaluation"))
    ids, mask = minilm.encode_text(sentences)
    (spec_ids, spec_mask), lengths = latency_inputs(minilm.spec(), 32, "eager")
    assert torch.equal(ids, spec_ids) and torch.equal(mask, spec_mask)
    assert lengths is not None and ids.shape[1] == lengths.length


def test_corpus_rows_and_the_verdict_against_the_fastest_peer(tmp_path: Path) -> None:
    """A peer that embedded the whole corpus gets a ``"workload": "corpus"`` row from its encode() rounds against
    torch fp32's encode(); the render names the best deployment's ratio to the fastest peer."""
    task = PairsData("words", ("a", "b", "c"), ("d", "e", "f"), (1.0, 2.0, 3.0))
    held = _pairs(tmp_path)
    result = _runner_result(tmp_path, 6, len(set(held.first) | set(held.second)))
    result["peers"][0]["corpus"] = {"baseline_s": [4.0] * 5, "peer_s": [2.0] * 5}
    corpus = ["A man is playing a guitar.", "A woman slices an onion.", "Dogs run."] * 30
    spec: dict[str, Any] = {"inputs": {peers.LATENCY_SET: {}, peers.DEV_SET: {}}, "batch": 32,
                            "corpus": {"sentences": corpus, "rounds": 5}}
    rows = peers.peer_rows("openvino", result, task, held, spec)
    corpus_rows = [r for r in rows if r.get("workload") == "corpus"]
    assert len(corpus_rows) == 1
    row = corpus_rows[0]
    assert row["end_to_end"] is True and row["batch"] == 32 and row["sentences"] == 90 and row["batches"] == 3
    assert row["speedup"] == 2.0 and row["sentences_per_s"] == pytest.approx(45.0)
    assert row["peer_ms"] == pytest.approx(2000.0 / 3)
    ours = {**row, "kind": "paretorch", "name": "paretorch: pack | int8d | ort (deployed)", "speedup": 3.0,
            "sentences_per_s": 67.5}
    summary = " ".join(peers.corpus_summary([*rows, ours]))
    assert "the fastest peer, OpenVINO default, 2.00x" in summary and "**1.50x the fastest peer**" in summary
    assert peers.corpus_summary(rows) == []  # no deployment measured: no verdict
