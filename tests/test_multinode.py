"""Two "nodes" on one machine: two torchrun agents (one process each) meet over loopback and train one shard each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TESTS, _tiny_args, free_port
from torchvision.datasets import ImageFolder


@pytest.mark.slow
def test_two_cpu_nodes_with_torchrun_train_one_shard_each(shapes_root: Path, tmp_path: Path) -> None:
    port = free_port()
    seen = tmp_path / "seen"
    callbacks = [{"class_path": "core_probes.SeenData", "init_args": {"out_dir": str(seen)}}]
    args = _tiny_args(shapes_root, tmp_path / "run", trainer__max_steps=3, trainer__limit_val_batches=0)
    args += ["--trainer.num_nodes", "2", "--trainer.strategy", "ddp", "--trainer.callbacks", json.dumps(callbacks)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), OMP_NUM_THREADS="1")
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc_per_node",
                "1",
                "--node_rank",
                str(rank),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(REPO / "train.py"),
                "fit",
                *args,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    ranks = [json.loads((seen / f"train_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert not set(ranks[0]["indices"]) & set(ranks[1]["indices"])
    assert len(ranks[0]["indices"]) == len(ranks[1]["indices"]) == len(ImageFolder(str(shapes_root / "train"))) // 2
    targets = ImageFolder(str(shapes_root / "train")).targets
    for r in ranks:  # each node trained on its own shard: 3 steps of 16 of its indices
        assert r["targets"] == [targets[i] for i in r["indices"]][:48]
