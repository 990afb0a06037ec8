#!/usr/bin/env bash
# The executors on one GPU, paper setting (K = 300 over all 60,000 FashionMNIST samples, ResNet-20,
# batch 8, FedCache `round` consistency): seconds per round of the sequential and the vectorized
# executor, the speed-up, peak GPU memory and the projected time of 1,000 rounds.
#
#   bash bench/gpu_check.sh            # on the GPU machine, from the repository root
#
# Needs python3 with torch and numpy only (bench/torch_harness.py); FashionMNIST from data/raw/ or
# the Debian package when present, else random images of the same shape (said in the output).
# Bounded to 7 minutes: sequential 1 round, vectorized 3 rounds (the best is reported).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name(0))'
exec timeout 420 python3 bench/executors.py --setting paper --device cuda --rounds 3 --seq-rounds 1 \
  --group-size "${GROUP_SIZE:-300}" "$@"
