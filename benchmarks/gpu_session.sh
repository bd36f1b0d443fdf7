#!/usr/bin/env bash
# The GPU issue's checks and tables, in three calls of the device tool (each well under its 10-minute limit).
#
#   bash benchmarks/gpu_session.sh verify   # every `gpu` test: the CUDA path, the Triton kernels in bf16, nccl
#   bash benchmarks/gpu_session.sh op       # tvq bench op, bf16: vq-triton vs vq-serial vs SDPA, 2k..131k
#   bash benchmarks/gpu_session.sh model    # tvq bench train (enwik8 preset, seq 8k), tvq bench decode (1k..64k) and
#                                           # the packing benchmark (packed vs unpacked training steps, 8k rows)
#
# A lent GPU machine has PyTorch, Triton and pytest in its image and nothing can be installed there, so the
# repository runs from its working tree (PYTHONPATH), with the image's python3 (PYTHON overrides it). Results and
# logs go to $OUT (what the device tool brings back) or, without it, to benchmarks/results. The versions of torch and
# triton there are recorded by every benchmark's machine record; say which ones ran in the note.
set -euo pipefail
stage=${1:?usage: bash benchmarks/gpu_session.sh verify|op|model}
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
day=$(date -u +%F)
tvq() { "$py" -m transformer_vq "$@"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu-$stage.txt"
"$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu-$stage.txt"
case "$stage" in
  verify)
    # the gpu tests, and the Triton kernel tests now on the GPU (compiled, not interpreted)
    "$py" -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/gpu tests/ops/vq/test_vq_triton.py \
      tests/ops/vq/test_vq_triton_documents.py 2>&1 \
      | tee "$out/gpu-tests.log" | tail -40 ;;
  op)
    tvq bench op --device cuda --precision bfloat16 --methods vq-triton vq-serial sdpa \
      --lengths 2k 8k 32k 131k --paired 8k 32k --out "$out" --name "op-bf16-$day-gpu" ;;
  model)
    tvq bench train --device cuda --precision bfloat16 --preset enwik8 --models vq/shga full/shga \
      --lengths 8k --out "$out" --name "train-enwik8-bf16-$day-gpu"
    tvq bench decode --device cuda --precision bfloat16 --contexts 1k 8k 64k --out "$out" \
      --name "decode-bf16-$day-gpu"
    "$py" -m transformer_vq.bench.packing --device cuda --precision bfloat16 --length 8192 \
      --out "$out/packing-bf16-$day-gpu.json" ;;
  *) echo "unknown stage $stage: use verify, op or model" >&2; exit 2 ;;
esac
