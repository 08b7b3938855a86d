"""One peer family of sentence-transformers backends, run by that family's own Python.

Executed as a script by the interpreter of a peer environment (:mod:`paretorch.experiments.bench.peer_envs`), never
imported by paretorch's runtime: it needs only the standard library, numpy, torch and the family's
packages, and no paretorch import.

    PEER_ENV/bin/python experiments/bench/peers_runner.py JOB.json

The job (written by :mod:`paretorch.experiments.bench.peers`) names the model directory, a work directory, the
family (``onnx`` or ``openvino``), the threads, the batch size, the timed sentence sets, the texts to
embed for the metrics and the calibration sentences. For each peer it writes, next to the job's ``out``
JSON: the embeddings of the metric texts (``.npy``), and the seconds of every timed round (each set's
batches, ``repeat`` times over), the peer and torch fp32 eager (``SentenceTransformer(path)``, the same
process, threads and token batches) in alternating order; with a job's ``corpus``, also each one's
``encode`` of that whole list of strings against the baseline's ``encode``. The bench computes the metrics and
speed-ups from those files.

Every peer is loaded through the public API as a user would: ``SentenceTransformer(path, backend=...)``,
``export_optimized_onnx_model``, ``export_dynamic_quantized_onnx_model``; OpenVINO static int8 follows
``export_static_quantized_openvino_model`` step by step but calibrates on the job's local sentences
(that function insists on a hub dataset). A peer that fails records its error and the others still run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # types alone: the runner imports no paretorch module when it runs
    from sentence_transformers import SentenceTransformer

    from paretorch.experiments.bench.peer_types import PeerInfo, RunnerJob, RunnerResult

#: The peers of each family, in the order they run (names as the bench renders them).
FAMILIES: dict[str, tuple[str, ...]] = {
    "onnx": ("ONNX fp32", "ONNX O3", "ONNX dynamic int8"),
    "openvino": ("OpenVINO default", "OpenVINO + NNCF static int8"),
}
#: Distributions whose versions each result records.
VERSIONS = ("torch", "sentence-transformers", "transformers", "optimum", "optimum-onnx", "optimum-intel",
            "onnxruntime", "openvino", "nncf", "numpy")
#: ``export_static_quantized_openvino_model``'s tokenization of calibration text.
OV_CALIBRATION_LENGTH = 384


def versions() -> dict[str, str]:
    """The installed versions of :data:`VERSIONS` (absent ones left out)."""
    found = {}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def batches(sentences: Sequence[str], size: int) -> list[list[str]]:
    """``sentences`` in consecutive batches of ``size`` (the last may be shorter)."""
    return [list(sentences[i : i + size]) for i in range(0, len(sentences), size)]


def forward_fn(model: SentenceTransformer, features: list[dict[str, torch.Tensor]]) -> Callable[[], None]:
    """One pass of ``model`` over every token batch (a fresh dict each call: the modules add keys to it)."""

    def run() -> None:
        with torch.inference_mode():
            for batch in features:
                model.forward(dict(batch))

    return run


def time_rounds(baseline: Callable[[], object], peer: Callable[[], object], rounds: int,
                warmup: int) -> dict[str, list[float]]:
    """Seconds per round of each, alternating which runs first, after ``warmup`` untimed passes of each."""
    for _ in range(warmup):
        baseline()
        peer()
    timed: dict[str, list[float]] = {"baseline_s": [], "peer_s": []}
    for index in range(rounds):
        order = (("baseline_s", baseline), ("peer_s", peer))
        for key, fn in order if index % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            fn()
            timed[key].append(time.perf_counter() - started)
    return timed


def ort_kwargs(threads: int, file_name: str | None) -> dict[str, object]:
    """ONNX Runtime on the CPU provider with ``threads`` intra-op threads, sequential."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    kwargs: dict[str, object] = {"provider": "CPUExecutionProvider", "session_options": options}
    if file_name:
        kwargs["file_name"] = file_name
    return kwargs


def ov_kwargs(threads: int, file_name: str | None) -> dict[str, object]:
    """OpenVINO on the CPU with ``threads`` inference threads and one stream; precision left to OpenVINO."""
    kwargs: dict[str, object] = {"ov_config": {"INFERENCE_NUM_THREADS": str(threads), "NUM_STREAMS": "1"}}
    if file_name:
        kwargs["file_name"] = file_name
    return kwargs


def ov_properties(model: Any) -> dict[str, str]:
    """The compiled OpenVINO model's precision, threads and streams, as OpenVINO reports them."""
    ov_model = model.transformers_model
    ov_model.compile()
    compiled = ov_model.request.get_compiled_model() if hasattr(ov_model.request, "get_compiled_model") \
        else ov_model.request
    return {key: _text(compiled.get_property(key))
            for key in ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT",
                        "EXECUTION_MODE_HINT")}


def _text(value: object) -> str:
    """An OpenVINO property as text: ``bf16`` for an element type (``str`` gives ``<Type: 'bfloat16'>``)."""
    return str(value.to_string()) if hasattr(value, "to_string") else str(value)


def cpu_isa() -> str:
    """The dynamic-int8 configuration for this CPU: ``avx512_vnni``, ``avx512``, ``avx2`` or ``arm64``."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64"
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


#: Characters of a peer's error kept for its row (the whole traceback stays in the result's ``traceback``).
ERROR_CHARS = 300


def short_error(exc: BaseException) -> str:
    """``Type: message`` cut to :data:`ERROR_CHARS` (transformers lists every model type it knows)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def dynamic_int8_weights(isa: str) -> str:
    """The weight type ``export_dynamic_quantized_onnx_model(model, isa, path)`` names its file with
    (``onnx/model_<weights>_<isa>.onnx``): optimum's dynamic config for ``isa`` decides it (``quint8`` for
    ``avx2``, ``qint8`` for the others)."""
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    return str(getattr(AutoQuantizationConfig, isa)(is_static=False).weights_dtype.name.lower())


def load_onnx_peer(name: str, directory: Path, threads: int, isa: str) -> tuple[SentenceTransformer, PeerInfo]:
    """An ONNX peer: exported (once) into ``directory`` by sentence-transformers, then loaded with threads set."""
    from sentence_transformers import (
        SentenceTransformer,
        export_dynamic_quantized_onnx_model,
        export_optimized_onnx_model,
    )

    plain = directory / "onnx" / "model.onnx"
    if not plain.is_file():
        SentenceTransformer(str(directory), device="cpu", backend="onnx").save_pretrained(str(directory))
    if name == "ONNX fp32":
        file_name, how = "onnx/model.onnx", 'SentenceTransformer(path, backend="onnx")'
    elif name == "ONNX O3":
        file_name, how = "onnx/model_O3.onnx", 'export_optimized_onnx_model(model, "O3", path)'
        if not (directory / file_name).is_file():
            source = SentenceTransformer(str(directory), device="cpu", backend="onnx",
                                         model_kwargs={"file_name": "onnx/model.onnx"})
            export_optimized_onnx_model(source, "O3", str(directory))
    elif name == "ONNX dynamic int8":
        file_name = f"onnx/model_{dynamic_int8_weights(isa)}_{isa}.onnx"
        how = f'export_dynamic_quantized_onnx_model(model, "{isa}", path)'
        if not (directory / file_name).is_file():
            source = SentenceTransformer(str(directory), device="cpu", backend="onnx",
                                         model_kwargs={"file_name": "onnx/model.onnx"})
            export_dynamic_quantized_onnx_model(source, isa, str(directory))
    else:
        raise ValueError(f"unknown ONNX peer {name!r}")
    model = SentenceTransformer(str(directory), device="cpu", backend="onnx",
                                model_kwargs=ort_kwargs(threads, file_name))
    return model, {"how": how, "file": file_name}


def quantize_openvino(model: SentenceTransformer, directory: Path, calibration: Sequence[str]) -> str:
    """``export_static_quantized_openvino_model``'s steps (OVQuantizer, NNCF, the same tokenization and file
    name), calibrated on local sentences as an ``nncf.Dataset`` (that function insists on a hub dataset)."""
    import nncf
    from optimum.intel.openvino import OVConfig, OVQuantizationConfig, OVQuantizer
    from sentence_transformers.backend.utils import save_or_push_to_hub_model

    config = OVConfig(quantization_config=OVQuantizationConfig(num_samples=len(calibration)))
    quantizer = OVQuantizer.from_pretrained(model.transformers_model)
    tokens = model.tokenizer(list(calibration), padding="max_length", max_length=OV_CALIBRATION_LENGTH,
                             truncation=True, return_tensors="np")
    dataset = nncf.Dataset([{key: value[i : i + 1] for key, value in tokens.items()}
                            for i in range(len(calibration))])
    save_or_push_to_hub_model(
        export_function=lambda save_dir: quantizer.quantize(dataset, save_directory=save_dir, ov_config=config),
        export_function_name="export_static_quantized_openvino_model", config=config.quantization_config,
        model_name_or_path=str(directory), push_to_hub=False, create_pr=False, file_suffix="qint8_quantized",
        backend="openvino", model=model)
    return "openvino/openvino_model_qint8_quantized.xml"


def load_openvino_peer(name: str, directory: Path, threads: int,
                       calibration: Sequence[str]) -> tuple[SentenceTransformer, PeerInfo]:
    """An OpenVINO peer: the IR exported (once) into ``directory``, loaded with threads set."""
    from sentence_transformers import SentenceTransformer

    plain = directory / "openvino" / "openvino_model.xml"
    if not plain.is_file():
        SentenceTransformer(str(directory), device="cpu", backend="openvino").save_pretrained(str(directory))
    if name == "OpenVINO default":
        file_name, how = "openvino/openvino_model.xml", 'SentenceTransformer(path, backend="openvino")'
    elif name == "OpenVINO + NNCF static int8":
        file_name = "openvino/openvino_model_qint8_quantized.xml"
        how = (f"export_static_quantized_openvino_model's OVQuantizer + NNCF steps, calibrated on "
               f"{len(calibration)} local sentences (max_length {OV_CALIBRATION_LENGTH})")
        if not (directory / file_name).is_file():
            source = SentenceTransformer(str(directory), device="cpu", backend="openvino",
                                         model_kwargs={"file_name": "openvino/openvino_model.xml"})
            quantize_openvino(source, directory, calibration)
    else:
        raise ValueError(f"unknown OpenVINO peer {name!r}")
    model = SentenceTransformer(str(directory), device="cpu", backend="openvino",
                                model_kwargs=ov_kwargs(threads, file_name))
    return model, {"how": how, "file": file_name, "openvino": ov_properties(model)}


def embed(model: SentenceTransformer, texts: Sequence[str], batch: int, path: Path) -> str:
    """``model.encode`` of ``texts`` (as a user embeds them), saved as float32 ``.npy``; returns the path."""
    vectors = model.encode(list(texts), batch_size=batch, convert_to_numpy=True, show_progress_bar=False)
    np.save(path, np.asarray(vectors, dtype=np.float32))
    return str(path)


def run_peer(name: str, job: RunnerJob, directory: Path, baseline: SentenceTransformer,
             features: dict[str, list[dict[str, torch.Tensor]]], out: Path) -> PeerInfo:
    """Load one peer, embed the metric texts and time it against ``baseline`` on every sentence set."""
    family, threads = job["family"], job["threads"]
    started = time.perf_counter()
    if family == "onnx":
        model, info = load_onnx_peer(name, directory, threads, job.get("isa") or cpu_isa())
    else:
        model, info = load_openvino_peer(name, directory, threads, job["calibration"])
    info["prepare_seconds"] = time.perf_counter() - started
    slug = name.lower().replace(" ", "-").replace("+", "plus")
    info["embeddings"] = {key: embed(model, texts, job["batch"], out.parent / f"{out.stem}-{slug}-{key}.npy")
                          for key, texts in job["encode"].items()}
    info["timings"] = {
        key: time_rounds(forward_fn(baseline, batch_features), forward_fn(model, batch_features),
                         job["rounds"], job["warmup"])
        for key, batch_features in features.items()}
    if corpus := job.get("corpus"):  # the whole corpus from its strings, as a user embeds it: encode()
        info["corpus"] = time_rounds(encode_fn(baseline, corpus["sentences"], job["batch"]),
                                     encode_fn(model, corpus["sentences"], job["batch"]), corpus["rounds"], 1)
    return info


def encode_fn(model: SentenceTransformer, texts: Sequence[str], batch: int) -> Callable[[], object]:
    """``model.encode`` of the whole list, strings to normalized host embeddings (its own sorting and batching)."""
    return lambda: model.encode(list(texts), batch_size=batch, convert_to_numpy=True, show_progress_bar=False)


def main(argv: Sequence[str]) -> int:
    """Run the job file ``argv[0]``; write its result JSON."""
    if len(argv) != 1:
        print("error: usage: peers_runner.py JOB.json", file=sys.stderr)
        return 2
    job: RunnerJob = json.loads(Path(argv[0]).read_text())
    out = Path(job["out"])
    threads = job["threads"]
    torch.set_num_threads(threads)
    from sentence_transformers import SentenceTransformer

    directory = Path(job["work_dir"]) / "model"
    if not (directory / "config.json").is_file():
        shutil.copytree(job["model_dir"], directory, dirs_exist_ok=True)
    baseline = SentenceTransformer(str(directory), device="cpu")
    tokenize = getattr(baseline, "preprocess", None) or baseline.tokenize  # 6.x renamed it; 5.x has tokenize only
    features = {key: [dict(tokenize(batch)) for batch in batches(spec["sentences"], job["batch"])]
                for key, spec in job["inputs"].items()}
    timed = {key: batch_features * job["inputs"][key]["repeat"] for key, batch_features in features.items()}
    result: RunnerResult = {
        "family": job["family"], "versions": versions(), "python": platform.python_version(),
        "threads": threads, "torch_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "isa": job.get("isa") or cpu_isa(),
        "shapes": {key: [list(f["input_ids"].shape) for f in batch_features]
                   for key, batch_features in features.items()},
        "tokens": {key: [int(f["attention_mask"].sum()) for f in batch_features]
                   for key, batch_features in features.items()},
        "repeat": {key: spec["repeat"] for key, spec in job["inputs"].items()},
        "baseline": {"how": "SentenceTransformer(path) (torch fp32 eager)",
                     "embeddings": {key: embed(baseline, texts, job["batch"],
                                               out.parent / f"{out.stem}-torch-{key}.npy")
                                    for key, texts in job["encode"].items()}},
        "peers": [],
    }
    for name in job["peers"]:
        info: PeerInfo
        try:
            info = run_peer(name, job, directory, baseline, timed, out)
        except Exception as exc:  # recorded in the peer's row: the bench shows why it did not run
            info = {"error": short_error(exc), "traceback": traceback.format_exc()}
            print(f"{name}: failed: {info['error']}", file=sys.stderr, flush=True)
        else:
            print(f"{name}: done in {info['prepare_seconds']:.1f} s to prepare", flush=True)
        result["peers"].append({"name": name, **info})
        out.write_text(json.dumps(result, indent=2))
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
