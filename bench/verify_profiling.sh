#!/usr/bin/env bash
# Verifies the profiling window in real Nsight Systems reports (run on a GPU machine, from the project root).
#   bash bench/verify_profiling.sh OUTDIR [single|epoch|logstep|epochstart|epochlast|cutshort|windows|lightning2|torchrun2|torchrunN|ncu ...]
# single     : 1 process, ResNet-50 on the generated shapes JPEGs, window at step 20 for 10 steps,
#              nsys --capture-range=cudaProfilerApi
# epoch      : the same with 25 batches an epoch and validation on: the window crosses validation, a checkpoint and
#              an epoch's end after step 24 (their kernels must sit in the validation / checkpoint / epoch end ranges)
# logstep    : the single window with trainer.log_every_n_steps 5: the module's metrics reduction on the log steps
#              (an all-reduce under DDP) must sit inside a range too
# epochstart : a window opening at an epoch's first step (25 batches an epoch, window 25-29): the step report must
#              leave the loader's first fetch of the epoch out of the steps (before_window in the report's JSON)
# epochlast  : a window ending at an epoch's last step (25 batches an epoch, window 20-24) with exit_after: the
#              epoch's validation runs after the capture and writes its best checkpoint
# cutshort   : a window the run's end cuts short (steps 55-64 asked, max_steps 60): the capture holds steps 55-59
#              only, none of the fit's end after them (no kernel in an epoch end, metrics or checkpoint range)
# windows    : two windows (steps 20-24 and 40-44) with --capture-range-end=repeat
# lightning2 : 2 GPUs through Lightning's own launcher: one report holding both ranks
# torchrun2  : 2 GPUs through torchrun, one report per rank (%q{RANK})
# torchrunN  : every GPU of the machine through torchrun, one report per rank (the 4- and 8-GPU check)
# ncu        : Nsight Compute on a one-step window, and with the push/pop filter --nvtx-include "step 20/"
# COMPILE=MODE runs every stage with --model.compile MODE; under the CUDA-graph modes (reduce-overhead, max-autotune)
# nsys traces each graph's kernels (--cuda-graph-trace=node: by default a replayed graph is one opaque range).
set -uo pipefail
out=${1:?OUTDIR}; shift
mkdir -p "$out"
data=/tmp/shapes_bench
# The folder config (not the synthetic one, whose synthetic_* keys the generated source would warn it ignores); no
# validation unless a stage turns it on.
common=(--config configs/resnet50_imagenet.yaml --data.source generated --data.root "$data" --data.workers 8
        --data.crop_size 224 --trainer.max_steps 60 --trainer.limit_val_batches 0 --trainer.enable_progress_bar false
        --data.batch_size 128)
nsys_flags=(-s none -t cuda,nvtx --capture-range=cudaProfilerApi --force-overwrite true)
if [ -n "${COMPILE:-}" ]; then
  common+=(--model.compile "$COMPILE")
  case $COMPILE in reduce-overhead|max-autotune) nsys_flags+=(--cuda-graph-trace=node) ;; esac
fi
python3 -c "import shapes_dataset as s; s.generate('$data', train_per_class=400, val_per_class=10)"
status=0
run() { echo "+ $*"; "$@"; local rc=$?; echo "exit code: $rc"; [ $rc -eq 0 ] || status=1; return $rc; }
# The command's own output dropped, run's "+ command" and "exit code" lines kept.
quiet() { "$@" >/dev/null; }
for stage in "$@"; do
  case $stage in
  single)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/single" \
      python3 train.py "${common[@]}" --profile.start_step 20 --profile.num_steps 10
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/single.sqlite" "$out/single.nsys-rep"
    run python3 bench/check_nsys.py "$out/single.sqlite" --steps 20-29
    nsys stats --report nvtx_sum --format csv "$out/single.nsys-rep" 2>/dev/null | head -12 ;;
  epoch)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/epoch" python3 train.py "${common[@]}" \
      --data.batch_size 160 --trainer.limit_val_batches 2 --profile.start_step 20 --profile.num_steps 10
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/epoch.sqlite" "$out/epoch.nsys-rep"
    run python3 bench/check_nsys.py "$out/epoch.sqlite" --steps 20-29 ;;
  logstep)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/logstep" \
      python3 train.py "${common[@]}" --trainer.log_every_n_steps 5 --profile.start_step 20 --profile.num_steps 10
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/logstep.sqlite" "$out/logstep.nsys-rep"
    run python3 bench/check_nsys.py "$out/logstep.sqlite" --steps 20-29 ;;
  epochstart)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/epochstart" python3 train.py \
      "${common[@]}" --data.batch_size 160 --trainer.limit_val_batches 2 --trainer.logger.init_args.save_dir "$out/epochstart_run" \
      --profile.start_step 25 --profile.num_steps 5
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/epochstart.sqlite" "$out/epochstart.nsys-rep"
    run python3 bench/check_nsys.py "$out/epochstart.sqlite" --steps 25-29
    find "$out/epochstart_run" -name "*.md" -path "*step_report*" -exec cat {} + | head -40 ;;
  epochlast)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/epochlast" python3 train.py \
      "${common[@]}" --data.batch_size 160 --trainer.limit_val_batches 2 --trainer.logger.init_args.save_dir \
      "$out/epochlast_run" --profile.start_step 20 --profile.num_steps 5
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/epochlast.sqlite" "$out/epochlast.nsys-rep"
    run python3 bench/check_nsys.py "$out/epochlast.sqlite" --steps 20-24
    # The epoch's validation ran after the capture: its best checkpoint is there, next to last.ckpt.
    run ls "$out/epochlast_run"/*/version_0/checkpoints/best-epoch000-*.ckpt ;;
  cutshort)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/cutshort" \
      python3 train.py "${common[@]}" --profile.start_step 55 --profile.num_steps 10
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/cutshort.sqlite" "$out/cutshort.nsys-rep"
    # The check's JSON into a file (run's own "+ command" and "exit code" lines stay on the console).
    run sh -c 'python3 bench/check_nsys.py "$1" --steps 55-59 > "$2"' _ "$out/cutshort.sqlite" "$out/cutshort.json"
    tail -5 "$out/cutshort.json"
    run python3 -c "import json, sys
between = [p['kernels_between_steps'] for r in json.load(open(sys.argv[1])) for p in r['processes'].values()]
print('kernels between steps in the capture:', between)
sys.exit(0 if between and not any(between) else 1)" "$out/cutshort.json" ;;
  windows)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=repeat -o "$out/windows" \
      python3 train.py "${common[@]}" --profile.start_step '[20,40]' --profile.num_steps 5
    ls "$out"/windows*
    i=0; for rep in $(ls "$out"/windows*.nsys-rep | sort); do
      nsys export --type sqlite --force-overwrite true -o "$out/windows.$i.sqlite" "$rep" >/dev/null
      i=$((i+1)); done
    run python3 bench/check_nsys.py "$out/windows.0.sqlite" --steps 20-24
    run python3 bench/check_nsys.py "$out/windows.1.sqlite" --steps 40-44 ;;
  lightning2)
    run nsys profile "${nsys_flags[@]}" --capture-range-end=stop -o "$out/lightning2" \
      python3 train.py "${common[@]}" --trainer.devices 2 --trainer.strategy ddp --profile.start_step 20
    run quiet nsys export --type sqlite --force-overwrite true -o "$out/lightning2.sqlite" "$out/lightning2.nsys-rep"
    run python3 bench/check_nsys.py "$out/lightning2.sqlite" --steps 20-29 --processes 2 ;;
  torchrun2|torchrunN)
    n=2; [ "$stage" = torchrunN ] && n=$(nvidia-smi -L | wc -l)
    run torchrun --nproc_per_node "$n" --no-python nsys profile "${nsys_flags[@]}" --capture-range-end=stop \
      -o "$out/$stage.rank%q{RANK}" python3 train.py "${common[@]}" --trainer.devices "$n" --trainer.strategy ddp \
      --profile.start_step 20
    reports=()
    for ((r = 0; r < n; r++)); do nsys export --type sqlite --force-overwrite true -o "$out/$stage.rank$r.sqlite" \
      "$out/$stage.rank$r.nsys-rep" >/dev/null; reports+=("$out/$stage.rank$r.sqlite"); done
    run python3 bench/check_nsys.py "${reports[@]}" --steps 20-29 ;;
  ncu)
    # A one-step window holds every kernel of step 20, from every thread (autograd launches the backward pass from
    # its own); the push/pop filter "step 20/" matches the main thread's only. Both, counted (LaunchStats: one pass).
    for kind in window filter; do
      only=(); [ "$kind" = filter ] && only=(--nvtx-include "step 20/")
      run ncu --profile-from-start off --nvtx "${only[@]}" --section LaunchStats --launch-count 5000 \
        --clock-control none -o "$out/ncu_$kind" -f python3 train.py "${common[@]}" --profile.start_step 20 \
        --profile.num_steps 1
      ncu --import "$out/ncu_$kind.ncu-rep" --page raw --csv 2>/dev/null > "$out/ncu_$kind.csv"
      python3 -c "import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))[1:]  # the second line holds the units
names = [r['Kernel Name'] for r in rows]
backward = [n for n in names if re.search('backward|dgrad|wgrad|bwd', n, re.I)]
print(sys.argv[2], len(names), 'kernels,', len(backward), 'of the backward pass, e.g.', backward[:2])
sys.exit(0 if names else 1)" "$out/ncu_$kind.csv" "$kind" || status=1
    done ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
exit $status
