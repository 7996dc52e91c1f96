"""A pre-resized copy of an ImageNet-layout folder: every image's short side at most ``--short-side`` pixels.

    python resize_dataset.py /data/imagenet /data/imagenet_256 --short-side 256 --workers 32
    python train.py --config configs/resnet50_imagenet.yaml --data.root /data/imagenet_256

Decoding is what the input path spends its time on, and a JPEG's decode cost follows its pixel count: on a 2-core x86
machine PIL decode + RandomResizedCrop + flip ran at 499 img/s per core on the 300-500 px JPEGs of
``bench/make_jpeg_folder.py`` and at 831 (1.66x) on the same files stored at short side 256
(``bench/pil_decode_rate.py``; bench/RESULTS.md, ninth session).
On an H200 the app's JPEG path, not the model, is the limit once the model is compiled (bench/RESULTS.md, ninth
session), so fewer pixels per file is images per second. FFCV's stores and the fast ImageNet runs of DAWNBench do the
same.

What it changes in training: RandomResizedCrop draws its boxes from the smaller image, so a small box is upsampled
from fewer source pixels (a square box of 8% of a 4:3 image is about 84 px wide at short side 256, 122 px at 375).
Validation's ``Resize(256)`` + ``CenterCrop(224)`` sees nearly the same pixels as on the originals (one resampling
more). Whether that costs accuracy in your recipe is yours to measure; nothing here measured it.

Files whose short side is already within the limit are copied byte for byte when they are upright JPEGs (RGB or
gray). Everything else is decoded as the training loader decodes it (``image_loading.load_rgb``: upright by its EXIF
orientation, 8-bit RGB, alpha composited on white, 16-bit scaled; a JPEG of at least twice the short side at a
power-of-two reduction that keeps it, which is faster), resized (bicubic) and stored as a JPEG of ``--quality``
under its own name, so that class folders, file names and labels stay the same and nvJPEG (``data.decode: gpu``) can
decode every file. A file that does not decode is copied unchanged and listed (one whose bytes cannot be read
either, such as a dangling link, becomes an empty file of the same name): the loader's bad-image policy
(``data.on_bad_image``) decides at training time, as it would on the source. Every class folder is made in the copy,
also one without images, so that its classes and labels are the source's.

Each file is written to a temporary name and renamed, so a copy never holds half a file (after a killed run; a power
loss is not covered: the files are not fsynced); an interrupted run resumes where it stopped (files already there are
kept), and lists the files an earlier run could not read with its own (``.resize_dataset.outcomes`` in the destination
records them, each before its file takes its name). The options and the source folder are recorded in
``resize_dataset.json`` in the destination, with ``complete`` true once every file is there; until then the data
module refuses to train on the copy. A run with other options, a destination that holds files this tool did not
write, or a second run into the same destination at the same time is refused before any file is written. The pool's
workers die with the run (a SIGKILL or a time limit included), so that none keeps the destination's lock.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import shutil
import signal
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

from atomic_files import atomic_write, temporary_name
from image_folder import RESIZE_MANIFEST, class_folders, read_resize_manifest, visible_samples
from image_loading import MAX_PIXELS, BadImageError, load_rgb

# The training loader raises PIL's process-wide limit to its own before opening a file; the header read here comes
# first, so without this a file the training loader takes would count as unreadable in a fresh worker.
if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < MAX_PIXELS:
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS

MANIFEST = RESIZE_MANIFEST
#: The longest side libjpeg writes (PIL refuses to save a JPEG with a longer one).
JPEG_MAX_SIDE = 65500
LOCK = ".resize_dataset.lock"
#: The outcome of a file whose bytes could not be read at all: written as an empty file of its name.
EMPTIED = "written empty (unreadable bytes)"
#: The outcomes whose files are listed at the end of a run.
LISTED = ("unreadable", "too wide for JPEG", EMPTIED)
#: One JSON line per file of a listed outcome, by this and every earlier run into the destination, appended before the
#: file is renamed into place, so that a resumed run lists what a killed one could not read; a file written again
#: (deleted from the copy to be redone) gets a line with its new outcome, which takes it off the list.
OUTCOMES = ".resize_dataset.outcomes"
SPLITS = ("train", "val")
#: PIL orientation tag; anything but 1 (or none) means the stored pixels are not upright.
_ORIENTATION = 0x0112


def image_files(root: Path, splits: Sequence[str] = SPLITS) -> Iterator[Path]:
    """Every image of ``root``'s splits as the app's dataset finds them (:func:`image_folder.visible_samples` over the
    visible class folders), relative to ``root``, in a fixed order."""
    for split in splits:
        folder = root / split
        if not folder.is_dir():
            continue
        classes = {name: i for i, name in enumerate(class_folders(folder))}
        for path, _ in visible_samples(folder, classes, allow_empty=True):
            yield Path(path).relative_to(root)


def resize_one(
    source: Path, target: Path, short_side: int, quality: int, before_rename: Callable[[str], None] | None = None
) -> str:
    """Writes ``source``'s image with its short side at most ``short_side`` to ``target`` (atomically) and says what
    it did: ``kept`` (already there), ``copied`` (byte for byte), ``resized``, ``re-encoded``, ``unreadable`` (copied
    byte for byte), :data:`EMPTIED` (not even its bytes could be read) or ``too wide for JPEG`` (a side over 65,500
    pixels after the resize: copied byte for byte). ``before_rename`` gets the outcome of a file written, before the
    file takes its name."""
    if target.exists():
        return "kept"
    target.parent.mkdir(parents=True, exist_ok=True)
    # Shortened to fit the folder's longest name, as atomic_files' own temporary names: a name the source holds must
    # fit here too.
    partial = target.parent / temporary_name(target.name, target.parent, f".{os.getpid()}.partial")
    try:
        outcome = _write(source, partial, short_side, quality)
        if before_rename is not None:
            before_rename(outcome)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return outcome


def _write(source: Path, partial: Path, short_side: int, quality: int) -> str:
    try:
        with Image.open(source) as image:
            fmt, mode, size = image.format, image.mode, image.size
            upright = image.getexif().get(_ORIENTATION, 1) == 1
            if min(size) <= short_side and fmt == "JPEG" and mode in ("RGB", "L") and upright:
                image.load()  # decodable as it is: the very bytes go
                shutil.copyfile(source, partial)
                return "copied"
        # Everything else is decoded as training decodes it (upright, 8-bit RGB, alpha on white, 16-bit scaled); a JPEG
        # of twice the short side or more at a power-of-two reduction that keeps it (libjpeg's DCT scaling: faster).
        image = load_rgb(str(source), draft_min_side=short_side)
    except (BadImageError, OSError, ValueError, SyntaxError, TypeError, IndexError, EOFError, struct.error,
            zlib.error, Image.DecompressionBombError):  # fmt: skip
        try:
            data = source.read_bytes()
        except OSError:
            # Not even its bytes can be read (a dangling link, no permission): an empty file of the same name keeps
            # the copy's samples and labels those of the source, and the loader says "empty" of it at training time.
            # (Only the source's read: an error writing the copy, a full disk, stops the run.)
            partial.write_bytes(b"")
            return EMPTIED
        partial.write_bytes(data)
        return "unreadable"
    width, height = image.size
    outcome = "re-encoded"
    if min(width, height) > short_side:
        scale = short_side / min(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        outcome = "resized"
    if max(image.size) > JPEG_MAX_SIDE:
        # A panorama the training loader takes (up to MAX_PIXELS) but no JPEG can hold: the original goes.
        shutil.copyfile(source, partial)
        return "too wide for JPEG"
    image.save(partial, "JPEG", quality=quality)
    return outcome


def _worker_start() -> None:
    """In each pool worker: die with the run. Killed (SIGTERM, SIGKILL, a time limit), the run cannot stop its workers,
    which would wait for work forever, holding the destination's lock that they inherited, and every resume would be
    refused as "another run is writing". The parent is the run, or a forkserver (its start method): whichever it is,
    its death ends the worker."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1  # noqa: N806 - prctl's name
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _resize_chunk(args: tuple[str, str, list[str], int, int, frozenset[str]]) -> list[tuple[str, str]]:
    """Resizes ``names``; ``relisted``: those of them an earlier run listed, whose new outcome is recorded whatever it
    is (a file deleted from the copy and written again may be readable now)."""
    src, dst, names, short_side, quality, relisted = args
    done = []
    for name in names:

        def record(outcome: str, name: str = name) -> None:
            if outcome in LISTED or name in relisted:
                record_outcome(Path(dst), name, outcome)

        done.append((name, resize_one(Path(src) / name, Path(dst) / name, short_side, quality, record)))
    return done


def record_outcome(dst: Path, name: str, outcome: str) -> None:
    """Appends ``name``'s outcome to ``dst``'s :data:`OUTCOMES` in one write (the pool's workers append at once)."""
    line = (json.dumps({"file": name, "outcome": outcome}) + "\n").encode()
    fd = os.open(dst / OUTCOMES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def listed_files(dst: Path) -> dict[str, str]:
    """The files of ``dst`` with a listed outcome, by name, as :data:`OUTCOMES` records them (the last line of a name
    wins; a line a kill cut short is skipped)."""
    try:
        lines = (dst / OUTCOMES).read_bytes().splitlines()
    except FileNotFoundError:
        return {}
    listed: dict[str, str] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            name, outcome = entry["file"], entry["outcome"]
        except (ValueError, KeyError, TypeError):
            continue
        if outcome in LISTED:
            listed[name] = outcome
        else:
            listed.pop(name, None)
    return listed


def check_paths(src: Path, dst: Path, options: dict) -> dict | None:
    """Refuses what would go wrong before any file is written: no splits in ``src``, ``dst`` inside ``src`` (or the
    other way round), ``dst`` a file, a ``dst`` written with other options or holding files this tool did not write.
    Returns the manifest already in ``dst`` (``None`` for a new copy)."""
    if not src.is_dir():
        raise SystemExit(f"resize_dataset: source {src} is not a folder")
    found = [s for s in SPLITS if (src / s).is_dir() and class_folders(src / s)]
    if not found:
        raise SystemExit(f"resize_dataset: {src} has no train/<class>/ or val/<class>/ folders (an ImageNet layout)")
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r or src_r in dst_r.parents or dst_r in src_r.parents:
        raise SystemExit(f"resize_dataset: destination {dst} and source {src} must not contain each other")
    if dst.exists() and not dst.is_dir():
        raise SystemExit(f"resize_dataset: destination {dst} is a file; give a folder (new, or an earlier copy)")
    above = next((p for p in dst.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise SystemExit(f"resize_dataset: {above} is a file, so the destination {dst} cannot be made in it")
    manifest = dst / MANIFEST
    if manifest.is_file():
        try:
            written = read_resize_manifest(manifest)
        except ValueError as error:
            # Written atomically by this tool, so it was not left so by an interrupted run.
            raise SystemExit(f"resize_dataset: {error}: use another destination, or remove {dst}") from None
        # A manifest of an earlier version of this tool records no source: taken as this one.
        earlier = {k: written.get(k, options[k] if k == "source" else None) for k in options}
        if earlier["source"] != options["source"] and {**earlier, "source": None} == {**options, "source": None}:
            raise SystemExit(
                f"resize_dataset: {dst} is a copy of {earlier['source']}, not of {options['source']}: use another "
                f'destination; if the same dataset moved there, set "source" in {manifest} to the new path to '
                "resume"
            )
        if earlier != options:
            raise SystemExit(
                f"resize_dataset: {dst} was written with {earlier}, not {options}: use another destination, or "
                "the same options to resume"
            )
        return written
    # The lock, and the temporary file of a manifest write that a kill cut short, are this tool's.
    ours = (LOCK, f".{MANIFEST}.")
    if dst.is_dir() and any(not entry.name.startswith(ours) for entry in os.scandir(dst)):
        raise SystemExit(
            f"resize_dataset: {dst} holds files but no {MANIFEST}, so this tool did not write them: use a new or "
            "empty folder"
        )
    return None


def _write_manifest(dst: Path, manifest: dict) -> None:
    # Synced: the manifest's "complete" must not reach the disk before the files it vouches for are named.
    atomic_write(dst / MANIFEST, lambda file: file.write(json.dumps(manifest).encode()))


def resize_folder(src: Path, dst: Path, short_side: int, quality: int, workers: int, chunk: int = 64) -> Counter:
    """Writes the pre-resized copy of ``src`` into ``dst``; returns how many files had each outcome."""
    options = {"short_side": short_side, "quality": quality, "source": str(src.resolve())}
    written = check_paths(src, dst, options)
    dst.mkdir(parents=True, exist_ok=True)
    with open(dst / LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"resize_dataset: another run is writing {dst}; wait for it to end") from None
        if written is not None and not written.get("complete"):
            print(f"resize_dataset: resuming the interrupted copy in {dst}", flush=True)
        # What a killed run left half-written (never renamed into place); no other run writes here now.
        for directory, _, files in os.walk(dst):
            for file in files:
                if file.startswith(".") and file.endswith(".partial"):
                    (Path(directory) / file).unlink(missing_ok=True)
        _write_manifest(dst, {**options, "complete": False})
        for split in SPLITS:
            # Every class folder, also one without images: the copy must have the source's classes and labels (the
            # app refuses an empty class folder in either).
            if (src / split).is_dir():
                for name in class_folders(src / split):
                    (dst / split / name).mkdir(parents=True, exist_ok=True)
        counts = _resize_all(src, dst, short_side, quality, workers, chunk)
        _write_manifest(dst, {**options, "complete": True})
    return counts


def _resize_all(src: Path, dst: Path, short_side: int, quality: int, workers: int, chunk: int) -> Counter:
    names = [str(p) for p in image_files(src)]
    log = dst / OUTCOMES
    recorded = log.read_bytes() if log.is_file() else b""
    if recorded and not recorded.endswith(b"\n"):
        with open(log, "ab") as file:
            file.write(b"\n")  # ends a line a kill cut short, which would swallow this run's first
    earlier = listed_files(dst)
    chunks = [
        (str(src), str(dst), part, short_side, quality, frozenset(n for n in part if n in earlier))
        for part in (names[i : i + chunk] for i in range(0, len(names), chunk))
    ]
    counts: Counter = Counter()
    # What the listed outcomes' files became ({shown}: the first ten; {dst}: the copy; {earlier}: how many of them an
    # earlier run wrote).
    said = {
        "unreadable": "PIL could not read were copied unchanged{earlier}: {shown}",
        "too wide for JPEG": "with a side over 65,500 pixels (no JPEG holds them) were copied unchanged{earlier}: "
        "{shown}",
        EMPTIED: "whose bytes could not be read (a dangling link, no permission) were written as empty files, which "
        "the loader reports as bad images{earlier}: {shown}; once they are readable, delete them from {dst} and run "
        "again to copy them",
    }
    by_earlier_run: Counter = Counter()
    start, done = time.perf_counter(), 0
    pool = None
    try:  # the pool made inside: a SIGTERM while it starts still cancels the queued chunks on the way out
        if workers > 1:
            pool = ProcessPoolExecutor(workers, initializer=_worker_start)
            results = pool.map(_resize_chunk, chunks)
        else:
            results = map(_resize_chunk, chunks)
        for result in results:
            for name, outcome in result:
                counts[outcome] += 1
                if outcome == "kept" and name in earlier:
                    by_earlier_run[earlier[name]] += 1
            done += len(result)
            if done % (chunk * 50) < len(result) or done == len(names):
                rate = done / max(time.perf_counter() - start, 1e-9)
                print(f"resize_dataset: {done}/{len(names)} files, {rate:.0f} files/s", flush=True)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    listed = listed_files(dst)
    for outcome in LISTED:
        files = sorted(name for name, its in listed.items() if its == outcome)
        if files:
            shown = ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "")
            n = by_earlier_run[outcome]
            earlier_note = f" ({n} of them by an earlier run)" if n else ""
            message = said[outcome].format(shown=shown, dst=dst, earlier=earlier_note)
            print(f"resize_dataset: {len(files)} file(s) {message}")
    return counts


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path, help="ImageNet-layout folder: train/<class>/*.JPEG, val/<class>/*.JPEG")
    p.add_argument("dst", type=Path, help="where the copy goes (created; resumed if a run with the same options ran)")
    p.add_argument("--short-side", type=int, default=256, help="largest short side kept, in pixels (default 256)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded files, 1-95 (default 90)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    p.add_argument("--workers", type=int, default=cores, help="processes (default: every core this process may use)")
    a = p.parse_args(argv)
    if a.short_side < 32:
        p.error(f"--short-side {a.short_side}: must be at least 32 pixels (the crops are 224 px; 256 is usual)")
    if not 1 <= a.quality <= 95:
        p.error(f"--quality {a.quality}: must be in 1-95 (PIL's JPEG range; 90 is ImageNet-like)")
    if a.workers < 1:
        p.error(f"--workers {a.workers}: must be at least 1")
    return a


def main(argv: Sequence[str] | None = None) -> None:
    a = parse(argv)
    # SIGTERM (a scheduler's kill, `timeout`) as an exception: the pool's workers are stopped and the lock released on
    # the way out, as on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.perf_counter()
    try:
        counts = resize_folder(a.src, a.dst, a.short_side, a.quality, a.workers)
    finally:
        signal.signal(signal.SIGTERM, previous)  # a caller in this process (a test) keeps its own
    total = sum(counts.values())
    summary = ", ".join(
        f"{counts[k]} {k}"
        for k in ("resized", "re-encoded", "copied", "kept", "unreadable", "too wide for JPEG", EMPTIED)
        if counts[k]
    )
    print(f"resize_dataset: {total} files in {time.perf_counter() - start:.1f} s ({summary or 'none'}) -> {a.dst}")
    # PIL in the workers, not the GPU decode path: on the small files they keep up, and the GPU path's host work in the
    # training process only slows it (bench/RESULTS.md, tenth session).
    print(f"resize_dataset: train on it with --data.root {a.dst} --data.decode cpu")


if __name__ == "__main__":
    main(sys.argv[1:])
