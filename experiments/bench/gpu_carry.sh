#!/usr/bin/env bash
# Makes the two folders a lent GPU machine needs for experiments/bench/gpu.sh (it has no network; each stays under
# 64 MiB, the most one device call carries): .whl, the Python 3.12 wheels its image lacks at this project's pins, and
# .carry, the MiniLM model as an fp16 copy, the MiniLM word-similarity and news files, and the dev split's pairs.
# Both folders are git-ignored. Run from the repository root after `make setup`, with PyPI reachable.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
names="alembic annotated-types bottle cachetools colorlog databricks-sdk fastapi gitdb GitPython google-auth
  importlib_metadata Mako mlflow-skinny mlflow-tracing opentelemetry-api opentelemetry-proto opentelemetry-sdk
  opentelemetry-semantic-conventions optuna optuna-dashboard plotly pydantic pydantic_core python-dotenv smmap
  SQLAlchemy sqlparse starlette torch-pruning torchao typing-inspection typing_extensions uvicorn"
pins=()
for name in $names; do
  pin=$(grep -i -m1 "^${name}==" constraints.txt) || { echo "error: $name has no pin in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
pins+=(greenlet)  # SQLAlchemy's, pinned for this platform only
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 --platform any --dest .whl "${pins[@]}"
mkdir -p .carry/word-similarity
$PY - <<'PY'
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from paretorch.experiments.models import minilm

source, target = minilm.model_dir(), Path(".carry/minilm")
shutil.rmtree(target, ignore_errors=True)
shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.onnx", "onnx", "openvino", "*.bin", "*.xml"))
for weights in target.rglob("*.safetensors"):
    save_file({k: v.half() if v.is_floating_point() else v for k, v in load_file(weights).items()}, str(weights))
print(f"{target}: {sum(f.stat().st_size for f in target.rglob('*') if f.is_file()) / 2**20:.1f} MiB")
PY
$PY - <<'PY'
import shutil
from pathlib import Path

from paretorch.experiments.data import news_sentences, word_similarity

folder = Path(".carry/word-similarity")
for name in (*word_similarity.FILES, news_sentences.FILE):
    shutil.copy(word_similarity.data_dir() / name, folder / name)
print(sorted(p.name for p in folder.iterdir()))
PY
$PY -m paretorch.experiments.data.sts_benchmark ../shared/data/sentence-similarity-dev/pairs.tsv .carry/sts-dev.tsv
du -sh .whl .carry
