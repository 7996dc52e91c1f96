"""How long releasing a worker's batch holds the GIL: ``del`` against ``buffer_release.release_host_buffer``.

A DataLoader worker sends a batch of the GPU decode path (``encoded_batch.encoded_collate``: one buffer in shared
memory) to the main process. There the buffer is released in one of two ways, while a second thread counts how long
it waits between two of its own iterations: that wait is the time the release held the GIL, which a training thread
would have spent not launching kernels. Runs on the CPU; prints a Markdown table.

    python bench/host_release.py                       # batches of 40 MB (256 finished crops of 224 x 224)
    python bench/host_release.py --mb 200 --batches 6
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from longest_pause import LongestPause  # noqa: E402 (bench/, the script's own folder)

from buffer_release import release_host_buffer  # noqa: E402
from encoded_batch import Encoded, encoded_collate  # noqa: E402


class Crops(Dataset):
    """Finished 224 x 224 crops, as the workers make them with data.cpu_decode_share 1."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Encoded, int]:
        pixels = torch.full((3, 224, 224), index % 251, dtype=torch.uint8)
        return Encoded(pixels, False, (0, 0, 224, 224), False, finished=True), index


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=256 * 3 * 224 * 224 / 2**20, help="MB per batch")
    p.add_argument("--batches", type=int, default=8, help="batches per way")
    a = p.parse_args()
    per_batch = max(1, round(a.mb * 2**20 / (3 * 224 * 224)))
    loader = DataLoader(
        Crops(per_batch * a.batches * 2), batch_size=per_batch, num_workers=2, collate_fn=encoded_collate
    )
    rows: dict[str, list[tuple[float, float]]] = {"del": [], "release_host_buffer": []}
    staged = torch.empty(per_batch * 3 * 224 * 224, dtype=torch.uint8)
    batches = iter(loader)
    for i in range(2 * a.batches):
        # No loop variable or enumerate() keeps the batch: the last reference is the one this step drops.
        packed = next(batches)[0]
        way = "del" if i % 2 == 0 else "release_host_buffer"
        # Read every page, as the copy to the device does: the pages are then mapped in this process too.
        staged.copy_(packed.data)
        time.sleep(0.02)  # the other thread settles
        with LongestPause() as pause:
            start = time.perf_counter()
            if way == "del":
                del packed
            else:
                release_host_buffer(packed.data)
                del packed
            took = time.perf_counter() - start
        rows[way].append((took, pause.longest))
    print(
        f"| release of a {per_batch * 3 * 224 * 224 / 2**20:.0f} MB batch from a worker | ms (median) | longest pause "
        "of another thread, ms (median / max) |"
    )
    print("|---|---|---|")
    for way, values in rows.items():
        took = sorted(t for t, _ in values)
        pauses = sorted(p for _, p in values)
        print(
            f"| {way} | {1e3 * took[len(took) // 2]:.2f} | {1e3 * pauses[len(pauses) // 2]:.2f} / "
            f"{1e3 * pauses[-1]:.2f} |"
        )


if __name__ == "__main__":
    main()
