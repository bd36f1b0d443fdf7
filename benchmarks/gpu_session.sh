#!/usr/bin/env bash
# The GPU checks and tables, sized for a lent GPU: one call of the device tool (at most 10 minutes a command, 15
# minutes of device time a session, at most 8 files back) runs every stage, each under its own time limit:
#
#   bash benchmarks/gpu_session.sh all      # verify, op, model in one call (about 9 minutes at most), then one tarball
#   bash benchmarks/gpu_session.sh verify   # the `gpu` tests not marked slow, and the Triton kernel tests compiled
#   bash benchmarks/gpu_session.sh op       # tvq bench op, bf16: vq-triton vs vq-serial vs SDPA, 2k..128k
#   bash benchmarks/gpu_session.sh model    # tvq bench train (enwik8 preset, seq 8k), tvq bench decode (1k..64k) and
#                                           # the packing benchmark (packed vs unpacked training steps, 8k rows)
#
# A lent GPU machine has PyTorch, Triton and pytest in its image and nothing can be installed there, so the
# repository runs from its working tree (PYTHONPATH), with the image's python3 (PYTHON overrides it). Results and
# logs go to $OUT (what the device tool brings back) or, without it, to benchmarks/results. `all` packs them into one
# file, gpu-session-DATE.tar, after every stage: the tool brings back at most 8 files, and a stage cut off by its
# limit still leaves what it finished (the benchmarks rewrite their JSON and table after every cell; pytest's output is
# unbuffered). The first session on a GPU (2026-11-26) lost its verify output and the op table to a run of separate
# stages whose pytest output sat in a pipe's buffer when its limit struck; this layout is what it taught.
# Limits in seconds: VERIFY_S, OP_S, MODEL_S (defaults 280, 150, 140: with the machine's start, one call's 10 minutes).
set -uo pipefail
stage=${1:?usage: bash benchmarks/gpu_session.sh all|verify|op|model}
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
day=$(date -u +%F)
tvq() { "$py" -m transformer_vq "$@"; }

machine() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
}

verify() {
  # Each test gets a limit, so one cannot eat the stage, and the session one short of the stage's, so that pytest
  # itself stops and prints which tests failed and why (pytest-timeout is in the GPU image): the second session on a
  # GPU (2026-11-27) lost its verify output to the stage's kill. 90 s a test: Triton compiles a kernel's backward on
  # first use, seen over 40 s on an H100. tests/gpu first: the fused kernels' tests passed on an H100 in the third
  # session (2026-11-27), whose limit stopped pytest before the model, training and compiled checks of tests/gpu.
  local limit=()
  "$py" -c "import pytest_timeout" 2>/dev/null && limit=(--timeout 90 --session-timeout $(( ${VERIFY_S:-280} - 25 )))
  "$py" -m pytest -v -p no:cacheprovider -m "not slow" "${limit[@]}" -rfE --tb=short --durations 15 \
    tests/gpu tests/ops/vq/test_vq_triton.py tests/ops/vq/test_vq_triton_documents.py
}

op() {
  tvq bench op --device cuda --precision bfloat16 --methods vq-triton vq-serial sdpa --lengths 2k 8k 32k 128k \
    --paired 8k 32k --budget-s 30 --out "$out" --name "op-bf16-$day-gpu"
}

model() {
  tvq bench train --device cuda --precision bfloat16 --preset enwik8 --models vq/shga full/shga \
    --lengths 8k --out "$out" --name "train-enwik8-bf16-$day-gpu"
  tvq bench decode --device cuda --precision bfloat16 --contexts 1k 8k 64k --out "$out" \
    --name "decode-bf16-$day-gpu"
  "$py" -m transformer_vq.bench.packing --device cuda --precision bfloat16 --length 8192 --block-len 128 \
    --out "$out/packing-bf16-$day-gpu.json"
}

# one stage under its limit, its output in $out/STAGE.log; prints the log's end and the stage's exit code
# (124: the limit struck)
timed() {
  local name=$1 limit=$2 start=$SECONDS rc
  { machine; "$name"; } > "$out/$name.log" 2>&1 &
  local pid=$!
  ( sleep "$limit"; kill -TERM -- -$pid 2>/dev/null || kill -TERM $pid 2>/dev/null ) &
  local watchdog=$!
  wait $pid; rc=$?
  kill $watchdog 2>/dev/null; wait $watchdog 2>/dev/null
  (( rc == 143 )) && rc=124
  echo "== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/stages.txt"
  tail -n 30 "$out/$name.log"
}

pack() {  # everything but the tarball itself into one file
  tar -cf "$out/gpu-session-$day.tar.tmp" -C "$out" --exclude "gpu-session-*.tar*" . \
    && mv "$out/gpu-session-$day.tar.tmp" "$out/gpu-session-$day.tar"
}

case "$stage" in
  all)
    set -m  # each stage in its own process group, so its limit stops its children (benchmark cells) too
    timed verify "${VERIFY_S:-280}"; pack
    timed op "${OP_S:-150}"; pack
    timed model "${MODEL_S:-140}"; pack ;;
  verify|op|model) machine; "$stage" ;;
  *) echo "unknown stage $stage: use all, verify, op or model" >&2; exit 2 ;;
esac
