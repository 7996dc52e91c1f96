#!/usr/bin/env bash
# One device call: GPU tests, then the throughput table on synthetic data and on a generated JPEG folder.
#   bash bench/gpu_session.sh OUTDIR [PRECISION...]
set -uo pipefail
out=${1:?OUTDIR}; shift
mkdir -p "$out"
python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -15 | tee "$out/pytest_gpu.txt"
python3 bench/make_jpeg_folder.py /tmp/jpegs --classes 100 --train-per-class 96 --val-per-class 4 | tee "$out/jpegs.txt"
for precision in "${@:-bf16}"; do
  python3 bench/throughput.py --arch resnet50 --precision "$precision" --channels-last --workers "$(nproc)" \
    --variants raw,app_synthetic,app_nvtx,app_folder,app_folder_gpu --data /tmp/jpegs 2>&1 \
    | tee "$out/throughput_$precision.txt" | grep -v "^app\|^raw"
done
