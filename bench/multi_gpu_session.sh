#!/usr/bin/env bash
# One device call on a multi-GPU machine (2, 4 or 8 GPUs): DDP scaling of the app against the plain loop, on synthetic
# data and on a generated JPEG folder, then one nsys report per rank of a window at step 20 for 10 steps.
#   bash bench/multi_gpu_session.sh OUTDIR [PRECISION] [FOLDER_VARIANT]
# FOLDER_VARIANT: app_folder (PIL in workers) or app_folder_gpu (nvJPEG, the default); loader workers per rank are
# the machine's cores divided by its GPUs.
set -uo pipefail
out=${1:?OUTDIR}; precision=${2:-bf16}; folder=${3:-app_folder_gpu}
n=$(nvidia-smi -L | wc -l)
mkdir -p "$out"
python3 bench/make_jpeg_folder.py /tmp/jpegs --classes 100 --train-per-class 96 --val-per-class 4 | tee "$out/jpegs.txt"
python3 bench/throughput.py --arch resnet50 --precision "$precision" --channels-last --gpus "1,$n" \
  --launcher torchrun --variants "raw,app_synthetic,$folder" --data /tmp/jpegs --workers $(($(nproc) / n)) 2>&1 \
  | tee "$out/scaling_${n}gpu_$precision.txt" | grep -v "^app\|^raw"
bash bench/verify_profiling.sh "$out/prof" torchrunN 2>&1 | tee "$out/prof_${n}gpu.log" \
  | grep '^+ \|exit code\|"ok"\|kernels\|outside'
rm -f "$out"/prof/*.sqlite
