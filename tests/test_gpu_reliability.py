"""Reliability on GPUs (``python -m pytest -m gpu``; skipped without CUDA).

* Two runs of ``python train.py`` with ``--trainer.deterministic true`` on one GPU (cuDNN deterministic, no
  benchmark, deterministic algorithms, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``) train on the same batches with bitwise
  identical losses and end with identical weights: fp32, and bf16-mixed with channels_last and ``data.decode: gpu``.
* NCCL DDP on two GPUs (``reliability_scripts/train_driver.py``): a rank SIGKILLed in the middle of training makes the
  other exit with an error within the DDP timeout (``DDPStrategy(timeout=...)``, ``--trainer.strategy.timeout`` in
  train.py), not hang. Either rank: rank 1 (a child of rank 0 under Lightning's launcher, whose observer kills the
  job), or rank 0 (its child rank 1 is then orphaned and must end on its own: through the failing gloo exchange of
  the preemption handler, or NCCL's watchdog, which tears the process down once a collective has waited the timeout
  and then 4 x ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` for its debug dump;
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` defaults to 3, tear down without cleanup, in torch 2.2 and later, and is left
  at that default here). The CPU version of the rank-0 case (gloo) is in test_preemption.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

TESTS = Path(__file__).resolve().parent
DRIVER = TESTS / "reliability_scripts" / "train_driver.py"
REAPER = TESTS / "reliability_scripts" / "reaper.py"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

#: Extra train.py options of each deterministic variant.
VARIANTS: dict[str, dict[str, str]] = {
    "fp32": {},
    "bf16-channels_last-gpu_decode": {
        "trainer__precision": "bf16-mixed",
        "model__channels_last": "true",
        "data__decode": "gpu",
    },
}
STEPS = 8
STEP_FIELDS = ("epoch", "batch_idx", "loss", "lr", "images", "targets")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_deterministic_cuda_runs_are_bitwise_identical(
    variant: str, shapes_root: Path, tmp_path: Path, tiny_args, run_train, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What torch.use_deterministic_algorithms needs for cuBLAS (Lightning sets it too, in the process, but only once
    # the CLI has parsed deterministic: set it before CUDA starts).
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    runs = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        run_dir.mkdir()
        probe = [{"class_path": "reliability_scripts.step_probe.StepRecord", "init_args": {"path": "steps.jsonl"}}]
        args = tiny_args(
            shapes_root,
            run_dir,
            trainer__accelerator="gpu",
            trainer__devices=1,
            trainer__deterministic="true",
            trainer__max_epochs=1,
            trainer__limit_train_batches=STEPS,
            trainer__limit_val_batches=2,
            trainer__log_every_n_steps=1,
            trainer__callbacks=json.dumps(probe),
            data__workers=2,
            data__batch_size=16,
            **VARIANTS[variant],
        )
        result = run_train(["fit", *args], cwd=run_dir, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        records = read_jsonl(run_dir / "steps.jsonl")
        (last,) = run_dir.glob("logs/*/checkpoints/last.ckpt")
        runs.append({"records": records, "checkpoint": torch.load(last, map_location="cpu", weights_only=False)})
    (start_a, *steps_a), (start_b, *steps_b) = runs[0]["records"], runs[1]["records"]
    for start in (start_a, start_b):
        assert start["deterministic"] is True and start["cudnn_benchmark"] is False
        assert start["cublas_workspace"] == ":4096:8"
    assert [record["step"] for record in steps_a] == list(range(STEPS))
    for a, b in zip(steps_a, steps_b, strict=True):
        assert {f: a[f] for f in STEP_FIELDS} == {f: b[f] for f in STEP_FIELDS}, a["step"]
    weights_a, weights_b = runs[0]["checkpoint"]["state_dict"], runs[1]["checkpoint"]["state_dict"]
    assert weights_a.keys() == weights_b.keys()
    differing = [name for name, tensor in weights_a.items() if not torch.equal(tensor, weights_b[name])]
    assert not differing, f"{len(differing)} of {len(weights_a)} tensors differ: {differing[:5]}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.skipif(not dist.is_nccl_available(), reason="needs NCCL")
@pytest.mark.parametrize("die_rank", [1, 0])
def test_nccl_rank_killed_mid_training_makes_the_other_exit_within_the_timeout(
    die_rank: int, shapes_root: Path, tmp_path: Path
) -> None:
    timeout = 30  # the DDP timeout; it also bounds the start-up rendezvous of both processes
    # After a collective has waited the timeout, NCCL's watchdog waits 4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC
    # (15 s by default: a minute) for the flight recorder's debug dump before it ends the process (measured on 2
    # H200s with the default: 75 s from the kill to the exit with a 15 s timeout). A shorter wait keeps the test short
    # and shows that the bound follows the setting.
    dump_wait_ms = 2000
    slack = 4 * dump_wait_ms / 1000 + 30  # the dump wait, the watchdog's polling, process teardown
    out = tmp_path / "run"
    out.mkdir()
    env = dict(os.environ)
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT"):
        env.pop(name, None)  # torch's defaults: what a user gets
    env["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] = str(dump_wait_ms)
    command = [
        sys.executable, str(REAPER), str(out / "exits.json"),
        sys.executable, str(DRIVER), "--root", str(shapes_root), "--out", str(out), "--accelerator", "gpu",
        "--devices", "2", "--timeout-s", str(timeout), "--ready-step", "2",
        "--die-rank", str(die_rank), "--die-step", "5", "--die-mode", "kill",
    ]  # fmt: skip
    with open(tmp_path / "run.log", "w") as log:
        # The reaper ends once every rank has ended; in its own session, so that the test can kill all of them.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            status = process.wait(timeout + slack + 120)  # + start-up
        except subprocess.TimeoutExpired:
            pytest.fail(f"a rank still runs {timeout + slack + 120} s after the start:\n{tail(tmp_path / 'run.log')}")
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    output = tail(tmp_path / "run.log")
    survivor = 1 - die_rank
    dying = json.loads((out / f"dying_rank{die_rank}.json").read_text())
    ready = json.loads((out / f"ready_rank{survivor}.json").read_text())
    exits = json.loads((out / "exits.json").read_text())
    ended = exits[str(ready["pid"])]
    assert ended["status"] != 0, output
    assert ended["time"] - dying["time"] <= timeout + slack, (ended["time"] - dying["time"], output)
    assert status != 0, output  # the job's status (rank 0's)


def tail(path: Path) -> str:
    return path.read_text()[-6000:]
