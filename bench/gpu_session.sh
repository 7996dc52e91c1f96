#!/usr/bin/env bash
# One device call on a GPU machine, in stages, each bounded by STAGE_TIMEOUT seconds (default 240; 360 for tests: the
# GPU tests took about 290 s on an H200); report2 needs 2 GPUs, ddp-P at least 2:
#   bash bench/gpu_session.sh OUTDIR STAGE...
# tests    : python -m pytest -m gpu (every GPU test of the suite)
# decode   : bench/decode_bench.py: nvJPEG decode and the per-image vs batched crop/resize on a JPEG folder, and the
#            batched stage at each of BUDGETS (max_padded_pixels in 512 x 512 blocks, default "256,64,32")
# nvjpeg   : bench/nvjpeg_calls.py under nsys (new files of many sizes vs one size, the app's decode_batch, the own
#            nvJPEG handle of nvjpeg_batched.py with and without preallocation, data.nvjpeg preallocated), then the
#            cuMemFree/copy/sync counts per row (bench/nsys_api_by_range.py); only text comes back, not the report
# queues   : bench/nvjpeg_under_load.py: nvJPEG's batched call on an idle and a busy GPU at each of CONNECTIONS
#            (CUDA_DEVICE_MAX_CONNECTIONS values, default "8,32"), one process each
# eager-P  : bench/throughput.py, precision P (bf16|fp16), eager: raw loop, app synthetic, NVTX on, PIL folder, nvJPEG
# compile-P: the same compiled (torch.compile), without the NVTX and PIL rows
# split-P  : bench/throughput.py on 1 GPU pinned to CORES cores (default 16, as one H200 has on these machines;
#            CORES-2 workers): app synthetic, PIL folder, nvJPEG folder, and the decode split between them
#            (data.cpu_decode_share: each of SHARES, space-separated, default "0.6 0.7 0.8")
# matrix   : bench/throughput.py --matrix on 1 GPU pinned to CORES cores (default 16, CORES-2 workers): VARIANTS
#            (default raw, app synthetic, and the recommended JPEG path: split 0.5, data.nvjpeg preallocated, the
#            torchvision decoder in the workers) in each configuration of MATRIX (default fp16 and bf16, eager), one
#            table; e.g. MATRIX=fp16:reduce-overhead,bf16:reduce-overhead (STACKS_AFTER_S: each variant's own limit,
#            default 240 s; STAGE_TIMEOUT: the whole stage's, default 560 s here: the default matrix took about 150 s
#            on an H200 with the JPEG folder made, the two reduce-overhead configurations 342 s); ROUNDS=N runs the
#            list N times in rotated orders and gives each row's median (bench/throughput.py --rounds), in N times
#            the time: within STAGE_TIMEOUT that is one eager configuration a call (MATRIX=fp16:eager ROUNDS=3); a
#            stage its timeout stops prints the log's end, where each finished run's result line is
# resized-P: the split-P run (VARIANTS default app_synthetic,app_folder,app_folder_gpu@0.85) on the JPEG folder and
#            on its copy by resize_dataset.py at short side SIDE (default 256), one after the other, each with its own
#            synthetic row; COMPILE=MODE compiles every app row with that torch.compile mode (MODE:tuned: and
#            model.compile_tuning, as everywhere COMPILE is read), put before any +option; a raw row as it is (the
#            plain loop's default mode); then bench/pil_decode_rate.py on both folders, both
#            decoders (data.cpu_decoder pil and torchvision), one core and CORES-2 processes at once; e.g.
#            VARIANTS=app_synthetic,app_folder_tv,app_folder for the workers' two decoders side by side
# autotune-P: the app on synthetic data compiled with max-autotune under nsys for DURATION s (default 300; nsys then
#            stops the run; STAGE_TIMEOUT default 360 here), stacks of every thread at STACKS_AFTER_S (default 280),
#            GPU utilization every 2 s, then bench/kernel_timeline.py: kernels, GPU busy time and API calls per 20 s,
#            the longest kernels, each thread's last API calls; text only comes back. ResNet-50's compile took about
#            400 s without nsys (eleventh session), and the defaults stop the run inside it; reaching the training
#            steps under nsys needs DURATION, STACKS_AFTER_S and STAGE_TIMEOUT well above that (not tried)
# report   : a ResNet-50 profiling window with the step-time report (callbacks/step_timer.py) on the JPEG folder
#            (DECODE sets data.decode, default gpu; SHARE data.cpu_decode_share, default 0; NVJPEG data.nvjpeg, default
#            torchvision; THREADS data.decode_threads, default 1; SIDE=N reads the folder's resize_dataset.py copy at
#            short side N;
#            COMPILE=MODE sets model.compile; MODE:tuned also model.compile_tuning)
# report2  : the same on 2 GPUs (DDP): one report with both ranks; SHARE sets data.cpu_decode_share of both (default 0)
# report-synthetic, report2-synthetic: the same on synthetic data, the reference for the phases' GPU times (what the
#            input path and DDP's all-reduce add to forward and backward); PRECISION sets trainer.precision of all
#            four (default bf16-mixed)
# report-nsys: the report-synthetic run under nsys --capture-range=cudaProfilerApi (window 20-24; COMPILE as there,
#            with --cuda-graph-trace=node for the CUDA-graph modes), then nsys's kernel time per step beside the
#            report's median step (opening the window under nsys drains the GPU's queue; the host then runs ahead),
#            by kernel class (bench/kernel_classes.py); the summary stays in OUTDIR/report-nsys_kern_sum.csv, for
#            bench/kernel_classes.py --compare against another run's
# producer-nsys: train.py's window (steps 30-39) on the JPEG folder under nsys -t cuda,nvtx,osrt and
#            bench/producer_timing.py --nvtx, on CORES cores (default 16, CORES-2 workers): the producer's steps are NVTX
#            ranges, and bench/nsys_api_by_range.py --same-thread gives the CUDA calls (--every-api) and the OS calls
#            (--os-runtime) each step made, bench/nsys_threads.py each thread's API time and each stream's GPU time;
#            DECODE, SHARE (default 0.5), NVJPEG (default preallocated), COMPILE and PRECISION (default 16-mixed) as
#            the report stages; tracing the OS calls slows the run (to 3,805 img/s from about 5,750 for fp16 eager
#            ResNet-50, thirty-sixth session); only text comes back
# producer : the compiled decode split under bench/producer_timing.py on CORES cores (default 16; CORES-2 workers):
#            one process per variant of VARIANTS (default app_folder_gpu_tv@0.5 and @0.7, COMPILE default
#            reduce-overhead put in each, before any +threads=N), its img/s and where the prefetcher's producer
#            thread(s) spent each batch;
#            SYNC_RELEASE=1 frees the host buffers on the producer as before the releaser thread; PRODUCER_ARGS adds
#            producer_timing.py's other options (e.g. "--side-priority -1 --decode-priority -2"), TAG names the logs
#            of such a run apart; a synthetic row first
# ddp-P    : bench/throughput.py on 1 and all GPUs of the machine (torchrun): raw loop, app synthetic, app nvJPEG
#            folder; scaling. Workers: cores per GPU minus two (two left for each rank's training thread and producer)
# cpuload-P: bench/cpu_load.py around bench/throughput.py on all GPUs (torchrun, cores per GPU minus two workers,
#            VARIANTS default app_folder_gpu@0.85): per-core load and clock, the busiest threads (main, producer,
#            workers) of every rank
# RAW_LOOP=PATH: the plain PyTorch loop of the raw rows, which this repository does not ship (bench/throughput.py
# reads it; default .carry/raw_loop.py, where ../shared/device/prepare.sh puts the lab's loop); without it leave
# raw out of VARIANTS.
# VARIANTS overrides the eager/compile/ddp/matrix stages' variant list (comma-separated, see bench/throughput.py);
# under compile-P an app row may name its torch.compile mode, e.g. app_synthetic:reduce-overhead (STACKS_AFTER_S:
# each variant's own limit, default 240 s compiled; max-autotune's compile took about 400 s on an H200);
# LAUNCHER=lightning runs the ddp stage's app rows under Lightning's own launcher instead of torchrun.
# The JPEG folder holds at least 40,000 training images: the 20 + 50 steps of batch 256 stay inside each GPU's first
# epoch (bench/throughput.py refuses a folder where they would not; with 30,000, 2 GPUs crossed an epoch's end).
# The step reports (JSON, Markdown, PNG) land in OUTDIR/report_step_report/ and OUTDIR/report2_step_report/.
set -uo pipefail
out=${1:?OUTDIR}; shift
mkdir -p "$out"
limit=${STAGE_TIMEOUT:-240}
# The JPEG folder: 100 classes, enough images per class that 72 batches of 256 fit in each GPU's first epoch (at least
# 400 per class); named by its size so that a warm machine's smaller folder is not reused, written to a temporary
# name first so that an interrupted one is not either.
jpegs() {
  local gpus pc; gpus=$(nvidia-smi -L | wc -l); pc=$(( (72 * 256 * gpus + 99) / 100 )); [ "$pc" -lt 400 ] && pc=400
  data=/tmp/jpegs_$pc
  [ -d "$data" ] || { rm -rf "$data.partial" && python3 bench/make_jpeg_folder.py "$data.partial" --classes 100 \
    --train-per-class "$pc" --val-per-class 4 > "$out/jpegs.txt" && mv "$data.partial" "$data"; }
}
# A bench/throughput.py log's table (and bench/cpu_load.py's report after it); without one (a variant failed, or the
# stage's timeout stopped the run) the log's last 60 lines: the variants' stderr passes through to the log, so that is
# the error or the threads' stacks.
table() {
  if grep -qE "^\| (variant|config) \(" "$1"; then sed -nE '/^\| (variant|config) \(/,$p' "$1"; else tail -60 "$1"; fi
}
# A stage's command exited with status $1: anything but 0 is said, and the script's own exit status becomes 1, so that
# a failed stage (a filtered log shows no error) is never read as a finished one.
status=0
mark() { [ "$1" -eq 0 ] || { echo "!!! stage $stage: exit code $1"; status=1; }; }
# The comma-separated variants $2 with the torch.compile mode $1 (MODE or MODE:tuned) in each app variant, where
# bench/throughput.py's order NAME[@SHARE][:MODE][+OPTION...] puts it: before any +option (+threads=N, +bucket_view).
# raw stays as it is: the plain loop always compiles with the default mode and takes no suffix.
with_mode() {
  local v head list out=()
  IFS=, read -ra list <<< "$2"
  for v in "${list[@]}"; do
    head=${v%%+*}
    if [ "$head" = raw ]; then out+=("$v"); else out+=("$head:$1${v#"$head"}"); fi
  done
  (IFS=,; echo "${out[*]}")
}
# train.py's arguments for COMPILE=MODE[:tuned] (none when COMPILE is unset or empty).
compile_args() {
  [ -n "${COMPILE:-}" ] && echo --model.compile "${COMPILE%:tuned}"
  [[ ${COMPILE:-} == *:tuned ]] && echo --model.compile_tuning true
  return 0
}
# The folder's copy at short side $1 (resize_dataset.py resumes an interrupted copy and refuses other options).
resized() {
  python3 resize_dataset.py "$data" "${data}_$1" --short-side "$1" --workers "$(nproc)" > "$out/resize_$1.txt" 2>&1 \
    && grep "files in" "$out/resize_$1.txt" || { tail -3 "$out/resize_$1.txt"; return 1; }
}
for stage in "$@"; do
  echo "=== $stage (t=${SECONDS}s)"
  case $stage in
  tests) timeout "${STAGE_TIMEOUT:-360}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=25 tests \
    > "$out/pytest_gpu.txt" 2>&1; rc=$?
    tail -25 "$out/pytest_gpu.txt"; mark $rc ;;
  queues) jpegs; timeout "$limit" python3 bench/nvjpeg_under_load.py --data "$data" --connections "${CONNECTIONS:-8,32}" \
      > "$out/nvjpeg_under_load.txt" 2>&1; rc=$?
    grep "^|" "$out/nvjpeg_under_load.txt" || tail -20 "$out/nvjpeg_under_load.txt"; mark $rc ;;
  nvjpeg) jpegs; timeout "$limit" nsys profile -s none -t cuda,nvtx --force-overwrite true -o /tmp/nvjpeg_calls \
      python3 bench/nvjpeg_calls.py --data "$data" --share "${SHARE:-0.85}" --calls 15 --same-size 500 375 \
      > "$out/nvjpeg_calls.txt" 2>&1; rc=$?
    grep "^|" "$out/nvjpeg_calls.txt" || tail -20 "$out/nvjpeg_calls.txt"; mark $rc
    nsys export --type sqlite --force-overwrite true -o /tmp/nvjpeg_calls.sqlite /tmp/nvjpeg_calls.nsys-rep >/dev/null \
      && python3 bench/nsys_api_by_range.py /tmp/nvjpeg_calls.sqlite | tee "$out/nvjpeg_api_by_range.txt" \
      | grep -i "free\|alloc\|memcpy\|range" ;;
  decode) jpegs; timeout "$limit" python3 bench/decode_bench.py --data "$data" --batch 256 --iters 20 \
    --budgets "${BUDGETS:-256,64,32}" 2>&1 \
    | tee "$out/decode_bench.txt" | tail -20; mark "${PIPESTATUS[0]}" ;;
  eager-*|compile-*)
    jpegs; p=${stage#*-}; flags=(); variants=raw,app_synthetic,app_nvtx,app_folder,app_folder_gpu
    stacks=150; [ "${stage%%-*}" = compile ] && flags=(--compile) && variants=raw,app_synthetic,app_folder_gpu \
      && stacks=240
    variants=${VARIANTS:-$variants}
    BENCH_STACKS_AFTER_S=${STACKS_AFTER_S:-$stacks} timeout "$limit" python3 bench/throughput.py --arch resnet50 \
      --precision "$p" --channels-last "${flags[@]}" --workers "$(nproc)" --variants "$variants" --data "$data" \
      > "$out/throughput_$stage.txt" 2>&1; rc=$?
    table "$out/throughput_$stage.txt"; mark $rc ;;
  split-*)
    jpegs; p=${stage#*-}; cores=${CORES:-16}; variants=app_synthetic,app_folder,app_folder_gpu
    for share in ${SHARES:-0.6 0.7 0.8}; do variants+=",app_folder_gpu@$share"; done
    BENCH_STACKS_AFTER_S=150 timeout "$limit" taskset -c "0-$((cores - 1))" python3 bench/throughput.py \
      --arch resnet50 --precision "$p" --channels-last --workers $((cores - 2)) --variants "${VARIANTS:-$variants}" \
      --data "$data" > "$out/throughput_$stage.txt" 2>&1; rc=$?
    table "$out/throughput_$stage.txt"; mark $rc ;;
  matrix)
    jpegs; cores=${CORES:-16}
    BENCH_STACKS_AFTER_S=${STACKS_AFTER_S:-240} timeout "${STAGE_TIMEOUT:-560}" taskset -c "0-$((cores - 1))" python3 \
      bench/throughput.py --arch resnet50 --channels-last --workers $((cores - 2)) --data "$data" \
      --matrix "${MATRIX:-fp16:eager,bf16:eager}" --rounds "${ROUNDS:-1}" \
      --variants "${VARIANTS:-raw,app_synthetic,app_folder_gpu_preallocated_tv@0.5}" \
      > "$out/throughput_$stage.txt" 2>&1; rc=$?
    table "$out/throughput_$stage.txt"; mark $rc ;;
  resized-*)
    jpegs; p=${stage#*-}; cores=${CORES:-16}; side=${SIDE:-256}; flags=()
    resized "$side" || { mark 1; continue; }
    variants=${VARIANTS:-app_synthetic,app_folder,app_folder_gpu@0.85}
    [ -n "${COMPILE:-}" ] && flags=(--compile) && variants=$(with_mode "$COMPILE" "$variants")
    for folder in "$data" "${data}_$side"; do
      BENCH_STACKS_AFTER_S=${STACKS_AFTER_S:-240} timeout "$limit" taskset -c "0-$((cores - 1))" python3 \
        bench/throughput.py --arch resnet50 --precision "$p" --channels-last "${flags[@]}" --workers $((cores - 2)) \
        --variants "$variants" --data "$folder" > "$out/throughput_${stage}_$(basename "$folder").txt" 2>&1; rc=$?
      echo "--- $folder"; table "$out/throughput_${stage}_$(basename "$folder").txt"; mark $rc
    done
    # Both decoders (data.cpu_decoder), on one core and on as many processes at once as the runs had workers.
    for n in 1 $((cores - 2)); do
      timeout "$limit" python3 bench/pil_decode_rate.py --data "$data" "${data}_$side" --decoders pil torchvision \
        --images 300 --repeats 2 --processes "$n" | tee -a "$out/pil_decode_rate.txt"
    done ;;
  autotune-*)
    # GPU utilization every 2 s beside the run, and every kernel inside the CUDA graphs: whether a stall is a slow
    # kernel (busy GPU, few kernels) or the host waiting on something else (idle GPU).
    p=${stage#*-}; nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 2 \
      > "$out/autotune_smi.csv" & smi=$!
    BENCH_STACKS_AFTER_S=${STACKS_AFTER_S:-280} timeout "${STAGE_TIMEOUT:-360}" nsys profile -s none -t cuda,nvtx \
      --cuda-graph-trace=node --force-overwrite true --duration "${DURATION:-300}" -o /tmp/autotune \
      python3 bench/throughput.py --arch resnet50 --precision "$p" --channels-last --compile --workers 0 \
      --variants "${VARIANTS:-app_synthetic:max-autotune}" > "$out/autotune.txt" 2>&1
    # Not marked: nsys's --duration stopping the run inside the compile is this stage's purpose; the lines below say
    # how far it got.
    kill "$smi"
    grep -E "x1:|Epoch:|AUTOTUNE|Timeout|failed|Recompil|cudagraph" "$out/autotune.txt" | cut -c1-200 | tail -15
    awk -F', ' 'NR > 1 {print $2}' "$out/autotune_smi.csv" | sort | uniq -c | sort -rn | head -5
    nsys export --type sqlite --force-overwrite true -o /tmp/autotune.sqlite /tmp/autotune.nsys-rep >/dev/null \
      && python3 bench/kernel_timeline.py /tmp/autotune.sqlite --bin 20 | tee "$out/autotune_timeline.md" \
      | cut -c1-160 ;;
  report|report2|report-synthetic|report2-synthetic)
    n=1; [ "${stage%-synthetic}" = report2 ] && n=2
    if [ "${stage#*-}" = synthetic ]; then input=(--config configs/resnet50_synthetic.yaml)
    else jpegs; root=$data; if [ -n "${SIDE:-}" ]; then resized "$SIDE" || { mark 1; continue; }; root=${data}_$SIDE; fi
      input=(--config configs/resnet50_imagenet.yaml --data.root "$root" --data.workers $(($(nproc) / n))
      --data.decode "${DECODE:-gpu}" --data.cpu_decode_share "${SHARE:-0}" --data.nvjpeg "${NVJPEG:-torchvision}"
      --data.decode_threads "${THREADS:-1}"); fi
    input+=($(compile_args))
    rm -rf "/tmp/${stage}_run"  # an earlier call's report is never taken for this one's
    timeout "$limit" python3 train.py "${input[@]}" --data.batch_size 256 --trainer.devices "$n" \
      --trainer.precision "${PRECISION:-bf16-mixed}" --trainer.max_steps 40 --trainer.enable_progress_bar false \
      --trainer.default_root_dir "/tmp/${stage}_run" --trainer.logger.init_args.save_dir "/tmp/${stage}_run" \
      --profile.start_step 20 --profile.num_steps 10 > "$out/${stage}_run.txt" 2>&1; rc=$?
    grep -A9 "step report," "$out/${stage}_run.txt" | tee "$out/$stage.txt"
    [ $rc -eq 0 ] || tail -30 "$out/${stage}_run.txt"; mark $rc
    # The report only: the run folder also holds ResNet-50 checkpoints, and is deeper than a device call returns.
    report=$(ls -dt /tmp/"${stage}"_run/*/version_*/step_report 2>/dev/null | head -1)
    if [ -n "$report" ]; then cp -r "$report" "$out/${stage}_step_report"; else echo "no step report written"; mark 1; fi ;;
  report-nsys)
    input=(--config configs/resnet50_synthetic.yaml)
    input+=($(compile_args))
    flags=(-s none -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite true)
    case ${COMPILE:-} in reduce-overhead*|max-autotune|max-autotune:tuned) flags+=(--cuda-graph-trace=node) ;; esac
    # Never read an earlier run's: nsys stats reads the report's SQLite export when there is one, and an earlier run's
    # (older than this report) made it write no summary at all (thirty-first session).
    rm -f /tmp/report_nsys.nsys-rep /tmp/report_nsys.sqlite /tmp/report_nsys_cuda_gpu_kern_sum.csv
    timeout "$limit" nsys profile "${flags[@]}" -o /tmp/report_nsys python3 train.py "${input[@]}" \
      --data.batch_size 256 --trainer.precision "${PRECISION:-bf16-mixed}" --trainer.max_steps 30 \
      --trainer.enable_progress_bar false --trainer.default_root_dir /tmp/report_nsys_run \
      --trainer.logger.init_args.save_dir /tmp/report_nsys_run --profile.start_step 20 --profile.num_steps 5 \
      > "$out/${stage}_run.txt" 2>&1; rc=$?
    grep -A9 "step report," "$out/${stage}_run.txt" | tee "$out/$stage.txt"
    [ $rc -eq 0 ] || tail -30 "$out/${stage}_run.txt"; mark $rc
    # nsys's own count: every kernel of the 5 window steps, by class (conv/GEMM against the memory-bound rest).
    nsys stats --force-export=true -r cuda_gpu_kern_sum -f csv -o /tmp/report_nsys /tmp/report_nsys.nsys-rep \
      > "$out/${stage}_stats.txt" 2>&1 || { tail -5 "$out/${stage}_stats.txt"; mark 1; }
    cp /tmp/report_nsys_cuda_gpu_kern_sum.csv "$out/${stage}_kern_sum.csv" 2>/dev/null  # for kernel_classes --compare
    python3 bench/kernel_classes.py /tmp/report_nsys_cuda_gpu_kern_sum.csv --steps 5 | tee -a "$out/$stage.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || mark 1 ;;
  producer-nsys)
    jpegs; cores=${CORES:-16}
    rm -f /tmp/producer_nsys.nsys-rep /tmp/producer_nsys.sqlite
    timeout "$limit" taskset -c "0-$((cores - 1))" nsys profile -t cuda,nvtx,osrt -s none --cpuctxsw none \
      --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite true -o /tmp/producer_nsys \
      python3 bench/producer_timing.py --nvtx -- train.py --config configs/resnet50_imagenet.yaml $(compile_args) \
      --data.root "$data" --data.workers $((cores - 2)) --data.decode "${DECODE:-gpu}" \
      --data.cpu_decode_share "${SHARE:-0.5}" --data.nvjpeg "${NVJPEG:-preallocated}" --data.batch_size 256 \
      --trainer.precision "${PRECISION:-16-mixed}" --trainer.max_steps 60 --trainer.enable_progress_bar false \
      --trainer.default_root_dir /tmp/producer_nsys_run --trainer.logger.init_args.save_dir /tmp/producer_nsys_run \
      --profile.start_step 30 --profile.num_steps 10 > "$out/${stage}_run.txt" 2>&1; rc=$?
    grep -A9 "step report," "$out/${stage}_run.txt" | tee "$out/$stage.txt"
    grep -A24 "^producer timing" "$out/${stage}_run.txt" | grep -v "^$" | tee -a "$out/$stage.txt"
    [ $rc -eq 0 ] || tail -30 "$out/${stage}_run.txt"; mark $rc
    nsys export --type sqlite -o /tmp/producer_nsys.sqlite /tmp/producer_nsys.nsys-rep \
      > /dev/null 2>&1 || { echo "nsys export failed"; mark 1; }
    for which in --every-api --os-runtime; do
      python3 bench/nsys_api_by_range.py /tmp/producer_nsys.sqlite --same-thread "$which" | tee -a "$out/$stage.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || mark 1
    done
    python3 bench/nsys_threads.py /tmp/producer_nsys.sqlite --top 8 | tee -a "$out/$stage.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || mark 1 ;;
  producer)
    jpegs; cores=${CORES:-16}; mode=${COMPILE:-reduce-overhead}; sync=(); [ -n "${SYNC_RELEASE:-}" ] && sync=(--sync-release)
    read -ra extra <<< "${PRODUCER_ARGS:-}"
    for v in app_synthetic $(echo "${VARIANTS:-app_folder_gpu_tv@0.5,app_folder_gpu_tv@0.7}" | tr , ' '); do
      log="$out/producer${TAG:+_$TAG}_${v//[@:+=]/_}.txt"
      child=$(with_mode "$mode" "$v")  # the mode goes before +options (+threads=N)
      BENCH_STACKS_AFTER_S=${STACKS_AFTER_S:-240} timeout "$limit" taskset -c "0-$((cores - 1))" python3 \
        bench/producer_timing.py "${sync[@]}" "${extra[@]}" -- bench/throughput.py --arch resnet50 --precision bf16 --channels-last \
        --compile --workers $((cores - 2)) --data "$data" --child "$child" > "$log" 2>&1; rc=$?
      [ $rc -eq 0 ] || tail -20 "$log"; mark $rc
      echo "--- $child: $(grep -o '"img_s": [0-9.]*' "$log")"
      grep -A22 "^producer timing" "$log" | grep -v "^$"
    done ;;
  ddp-*)
    jpegs; p=${stage#*-}; n=$(nvidia-smi -L | wc -l)
    BENCH_STACKS_AFTER_S=120 timeout "$limit" python3 bench/throughput.py --arch resnet50 --precision "$p" \
      --channels-last --gpus "1,$n" --launcher "${LAUNCHER:-torchrun}" --workers $(($(nproc) / n - 2)) \
      --variants "${VARIANTS:-raw,app_synthetic,app_folder_gpu}" --data "$data" > "$out/throughput_$stage.txt" 2>&1
    rc=$?; table "$out/throughput_$stage.txt"; mark $rc ;;
  cpuload-*)
    jpegs; p=${stage#*-}; n=$(nvidia-smi -L | wc -l)
    BENCH_STACKS_AFTER_S=120 timeout "$limit" python3 bench/cpu_load.py --skip 15 --top 25 \
      --json "$out/cpu_load_$stage.json" -- python3 bench/throughput.py --arch resnet50 --precision "$p" \
      --channels-last --gpus "$n" --launcher torchrun --workers $(($(nproc) / n - 2)) \
      --variants "${VARIANTS:-app_folder_gpu@0.85}" --data "$data" > "$out/cpu_load_$stage.txt" 2>&1
    rc=$?; table "$out/cpu_load_$stage.txt"; mark $rc ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
echo "=== done (t=${SECONDS}s)$([ $status -eq 0 ] || echo ": a stage failed, see !!! above")"
exit $status
