#!/usr/bin/env bash
# The GPU check: FedCache rounds on one GPU, in two parts, each bounded in time.
#   1. The executors, paper setting (K = 300 over all 60,000 FashionMNIST samples, ResNet-20, batch 8,
#      `round` consistency): seconds per round of the sequential and the vectorized executor, the speed-up,
#      peak GPU memory and the projected time of 1,000 rounds (bench/executors.py). Goal: at most 1 s a
#      vectorized round.
#   2. The roofline of the official demo round and the paper round on the vectorized executor, fp32 and
#      bf16: the GPU's GEMM peak, each round's FLOPs, the achieved fraction and where the GPU's time goes
#      (bench/roofline.py --device cuda; the same tables as the CPU's).
#
#   bash bench/gpu_check.sh                        # on the GPU machine, from the repository root
#   RESULTS_DIR=$OUT bash bench/gpu_check.sh       # the tables' files written where they are fetched from
#
# Needs python3 with torch and numpy only (bench/torch_harness.py); FashionMNIST from data/raw/ or
# the Debian package when present, else random images of the same shape (said in the output).
# Both parts run whatever the other did; the exit status is non-zero if either failed or ran out of time.
# At most 6 minutes in all (a GPU machine is lent for 15 minutes, its start included).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS_DIR="${RESULTS_DIR:-bench/results}"
GROUP_SIZE="${GROUP_SIZE:-300}"
mkdir -p "$RESULTS_DIR"
python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name(0))' \
  || exit 1

status=0
echo "## 1. executors, paper setting (at most 180 s)"
timeout 180 python3 bench/executors.py --setting paper --device cuda --rounds 2 --seq-rounds 1 \
  --group-size "$GROUP_SIZE" "$@" | tee "$RESULTS_DIR/gpu-executors-paper.md" || status=1

echo "## 2. roofline, demo and paper settings (at most 180 s)"
timeout 180 python3 bench/roofline.py --device cuda --settings demo paper --executors vectorized \
  --precisions fp32 bf16 --rounds 1 --warmup 1 --group-size "$GROUP_SIZE" \
  --out-dir "$RESULTS_DIR" || status=1
exit "$status"
