#!/usr/bin/env bash
# One device call on a multi-GPU machine (2, 4 or 8 GPUs): DDP scaling of the app against the plain loop, on synthetic
# data and on a generated JPEG folder (bench/gpu_session.sh's ddp stage), then one nsys report per rank of a window
# at step 20 for 10 steps, each checked for its 10 step ranges and every kernel inside them.
#   bash bench/multi_gpu_session.sh OUTDIR [PRECISION]
set -uo pipefail
out=${1:?OUTDIR}; precision=${2:-bf16}
STAGE_TIMEOUT=${STAGE_TIMEOUT:-420} bash bench/gpu_session.sh "$out" "ddp-$precision"; status=$?
bash bench/verify_profiling.sh "$out/prof" torchrunN 2>&1 | tee "$out/prof_$(nvidia-smi -L | wc -l)gpu.log" \
  | grep '^+ \|exit code\|"ok"\|kernels\|outside'
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
rm -f "$out"/prof/*.sqlite
exit $status
