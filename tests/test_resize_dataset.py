"""resize_dataset.py: what each kind of file becomes, resuming, atomic writes, refusals before any work, the copy
loading in the data module; bench/pil_decode_rate.py's table."""

from __future__ import annotations

import fcntl
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import resize_dataset
from datamodule import ImageNetDataModule
from image_folder import VisibleImageFolder, check_layout

ROOT = Path(__file__).resolve().parent.parent


def _noise(width: int, height: int, mode: str = "RGB") -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "CMYK": 4}[mode]
    pixels = np.random.default_rng(width * height).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


def _jpeg(path: Path, image: Image.Image, **kwargs) -> Path:  # noqa: ANN003
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "JPEG", quality=90, **kwargs)
    return path


def source_folder(root: Path) -> Path:
    """One file of each kind the tool treats differently, in train/ and val/ class folders."""
    train, val = root / "train", root / "val"
    _jpeg(train / "a" / "large.JPEG", _noise(400, 300))
    _jpeg(train / "a" / "small.JPEG", _noise(200, 180))
    _jpeg(train / "a" / "gray.JPEG", _noise(300, 600, "L"))
    _jpeg(train / "b" / "cmyk.JPEG", _noise(120, 100, "CMYK"))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 300 x 200, shown rotated by 90 degrees: 200 x 300
    _jpeg(train / "b" / "rotated.JPEG", _noise(300, 200), exif=exif.tobytes())
    rgba = _noise(300, 400, "RGBA")
    rgba.putalpha(0)  # fully transparent: the training loader composites it on white
    rgba.save(train / "b" / "alpha.png")
    (train / "b" / "broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (train / "b" / "notes.txt").write_text("not an image")
    (train / ".hidden").mkdir()
    _jpeg(train / ".hidden" / "x.JPEG", _noise(400, 400))
    (train / "a" / ".ipynb_checkpoints").mkdir()
    _jpeg(train / "a" / ".ipynb_checkpoints" / "small-checkpoint.JPEG", _noise(200, 180))
    (train / "a" / "._small.JPEG").write_bytes(b"\x00\x05\x16\x07Mac OS X")
    _jpeg(val / "a" / "v.JPEG", _noise(500, 375))
    _jpeg(val / "b" / "nested" / "w.JPEG", _noise(260, 256))
    return root


def test_each_kind_of_file_becomes_an_upright_jpeg_within_the_short_side(tmp_path: Path, capsys) -> None:
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    resize_dataset.main([str(src), str(dst), "--short-side", "256", "--workers", "1"])
    out = capsys.readouterr().out
    assert "9 files in" in out and "(4 resized, 2 re-encoded, 2 copied, 1 unreadable)" in out
    assert "1 file(s) PIL could not read were copied unchanged: train/b/broken.JPEG" in out
    assert out.rstrip().endswith(f"train on it with --data.root {dst} --data.decode cpu")

    def opened(name: str) -> Image.Image:
        image = Image.open(dst / name)
        image.load()
        return image

    assert opened("train/a/large.JPEG").size == (341, 256) and opened("train/a/large.JPEG").format == "JPEG"
    assert (dst / "train/a/small.JPEG").read_bytes() == (src / "train/a/small.JPEG").read_bytes()
    assert opened("train/a/gray.JPEG").size == (256, 512) and opened("train/a/gray.JPEG").mode == "RGB"
    assert opened("train/b/cmyk.JPEG").mode == "RGB" and opened("train/b/cmyk.JPEG").size == (120, 100)
    rotated = opened("train/b/rotated.JPEG")
    assert rotated.size == (200, 300) and rotated.getexif().get(0x0112, 1) == 1  # upright, nothing left to rotate
    alpha = opened("train/b/alpha.png")  # the same name, JPEG content: as the loader composites it, on white
    assert alpha.format == "JPEG" and alpha.size == (256, 341) and np.asarray(alpha).min() > 240
    assert (dst / "train/b/broken.JPEG").read_bytes() == (src / "train/b/broken.JPEG").read_bytes()
    assert opened("val/a/v.JPEG").size == (341, 256)
    assert (dst / "val/b/nested/w.JPEG").read_bytes() == (src / "val/b/nested/w.JPEG").read_bytes()  # short side 256
    assert not (dst / "train/b/notes.txt").exists() and not (dst / "train/.hidden").exists()
    assert not (dst / "train/a/.ipynb_checkpoints").exists() and not (dst / "train/a/._small.JPEG").exists()
    assert not list(dst.rglob("*.partial"))
    assert (dst / resize_dataset.MANIFEST).is_file()


def test_a_second_run_keeps_what_is_there_and_cleans_what_a_killed_run_left(tmp_path: Path, capsys) -> None:
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    resize_dataset.main([str(src), str(dst), "--workers", "2"])  # in processes
    before = {p: p.stat().st_mtime_ns for p in dst.rglob("*") if p.is_file()}
    (dst / "train/a/.large.JPEG.123.partial").write_bytes(b"half")  # a run killed mid-write
    (dst / "train/a/large.JPEG").unlink()  # ... before this file was renamed into place
    capsys.readouterr()
    resize_dataset.main([str(src), str(dst), "--workers", "1"])
    assert "(1 resized, 8 kept)" in capsys.readouterr().out
    assert not list(dst.rglob("*.partial"))
    after = {p: p.stat().st_mtime_ns for p in dst.rglob("*") if p.is_file()}
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed == {dst / "train/a/large.JPEG", dst / resize_dataset.MANIFEST}


def test_a_panorama_no_jpeg_can_hold_is_copied_unchanged_and_listed(tmp_path: Path, capsys) -> None:
    # 70,000 x 100 pixels: the training loader takes it (7 M pixels), libjpeg writes no side over 65,500.
    src, dst = tmp_path / "src", tmp_path / "dst"
    for split in ("train", "val"):
        _jpeg(src / split / "a" / "small.JPEG", _noise(300, 200))
    wide = src / "train" / "a" / "wide.png"
    Image.new("RGB", (70_000, 100), (10, 20, 30)).save(wide)
    resize_dataset.main([str(src), str(dst), "--workers", "1"])
    assert (dst / "train/a/wide.png").read_bytes() == wide.read_bytes()
    out = capsys.readouterr().out
    assert (
        "1 file(s) with a side over 65,500 pixels (no JPEG holds them) were copied unchanged: train/a/wide.png" in out
    )
    assert "1 too wide for JPEG)" in out
    assert json.loads((dst / resize_dataset.MANIFEST).read_text())["complete"] is True


def test_a_failing_write_leaves_no_file_under_the_final_name(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "src"
    _jpeg(src / "train" / "a" / "x.JPEG", _noise(400, 300))

    def broken_save(self, fp, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        Path(fp).write_bytes(b"half a jpeg")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="No space left"):
        resize_dataset.resize_folder(src, tmp_path / "dst", 256, 90, workers=1)
    assert sorted(p.name for p in (tmp_path / "dst" / "train" / "a").iterdir()) == []


@pytest.mark.parametrize(
    ("make", "argv", "message"),
    [
        (lambda t: None, ["missing", "dst"], "source {t}/missing is not a folder"),
        (lambda t: (t / "flat").mkdir(), ["flat", "dst"], "has no train/<class>/ or val/<class>/ folders"),
        (lambda t: source_folder(t / "src"), ["src", "src/resized"], "must not contain each other"),
        (lambda t: source_folder(t / "src"), ["src", "src"], "must not contain each other"),
    ],
)
def test_bad_paths_are_refused_before_any_file_is_written(tmp_path: Path, make, argv, message) -> None:
    make(tmp_path)
    with pytest.raises(SystemExit, match=re.escape(message.format(t=tmp_path))):
        resize_dataset.main([str(tmp_path / argv[0]), str(tmp_path / argv[1]), "--workers", "1"])
    assert not (tmp_path / "dst").exists() and not (tmp_path / "src" / "resized").exists()


def test_a_destination_written_with_other_options_or_by_something_else_is_refused(tmp_path: Path) -> None:
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    resize_dataset.main([str(src), str(dst), "--short-side", "256", "--workers", "1"])
    assert json.loads((dst / resize_dataset.MANIFEST).read_text()) == {"short_side": 256, "quality": 90,
                                                                       "source": str(src.resolve()),
                                                                       "complete": True}  # fmt: skip
    before = {p: p.stat().st_mtime_ns for p in dst.rglob("*")}
    with pytest.raises(SystemExit, match=r"was written with \{'short_side': 256, 'quality': 90, 'source': .*\}, not "):
        resize_dataset.main([str(src), str(dst), "--short-side", "320", "--workers", "1"])
    # Resumed from another source, the copy would hold two datasets' files, marked complete.
    another = source_folder(tmp_path / "another")
    said = f"{dst} is a copy of {src.resolve()}, not of {another.resolve()}: use another destination; if the same "
    with pytest.raises(SystemExit, match=re.escape(said) + r'.*set "source" in .*resize_dataset.json to the new path'):
        resize_dataset.main([str(another), str(dst), "--short-side", "256", "--workers", "1"])
    assert {p: p.stat().st_mtime_ns for p in dst.rglob("*")} == before
    # A folder with files but no manifest: not a copy this tool wrote, whatever its files' sizes.
    other = tmp_path / "other"
    _jpeg(other / "train" / "a" / "large.JPEG", _noise(900, 900))
    with pytest.raises(SystemExit, match="holds files but no resize_dataset.json"):
        resize_dataset.main([str(src), str(other), "--workers", "1"])
    assert Image.open(other / "train" / "a" / "large.JPEG").size == (900, 900)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="destination .*file is a file"):
        resize_dataset.main([str(src), str(tmp_path / "file"), "--workers", "1"])
    # A manifest that is not this tool's (cut off by hand, or other JSON): refused with its name, nothing written.
    for text, reason in (('{"short_side": 256, "quali', "cannot be read"), ("[256, 90]", "is not resize_dataset")):
        (dst / resize_dataset.MANIFEST).write_text(text)
        before = {p: p.stat().st_mtime_ns for p in dst.rglob("*")}
        with pytest.raises(SystemExit, match=re.escape(f"{dst / resize_dataset.MANIFEST} {reason}")):
            resize_dataset.main([str(src), str(dst), "--short-side", "256", "--workers", "1"])
        assert {p: p.stat().st_mtime_ns for p in dst.rglob("*")} == before


def test_a_second_run_into_the_same_destination_at_once_is_refused(tmp_path: Path) -> None:
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    dst.mkdir()
    with open(dst / resize_dataset.LOCK, "a") as held:  # as the first run holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(SystemExit, match="another run is writing"):
            resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
    assert sorted(p.name for p in dst.iterdir()) == [resize_dataset.LOCK]  # nothing else written
    resize_dataset.resize_folder(src, dst, 256, 90, workers=1)  # once it is released
    assert json.loads((dst / resize_dataset.MANIFEST).read_text())["complete"] is True


def test_a_copy_killed_midway_resumes_and_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    calls = []

    def dies_after_three(*args):  # noqa: ANN002
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(args)
        return real(*args)

    real = resize_dataset.resize_one
    monkeypatch.setattr(resize_dataset, "resize_one", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
    assert json.loads((dst / resize_dataset.MANIFEST).read_text())["complete"] is False
    # Training on the 3 files written so far is refused, with the command that finishes the copy.
    with pytest.raises(
        ValueError,
        match=re.escape(f"{dst} is an unfinished copy by resize_dataset.py")
        + r".*"
        + re.escape(f"resize_dataset.py {src} {dst} --short-side 256 --quality 90 again"),  # the manifest's source,
    ):
        ImageNetDataModule(root=str(dst), workers=0, batch_size=2).setup("fit")
    monkeypatch.undo()
    capsys.readouterr()
    counts = resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
    assert "resuming the interrupted copy" in capsys.readouterr().out
    assert counts["kept"] == 3 and sum(counts.values()) == 9
    assert json.loads((dst / resize_dataset.MANIFEST).read_text())["complete"] is True
    assert check_layout(dst) == check_layout(src) == ["a", "b"]


def test_a_resumed_copy_lists_what_the_killed_run_could_not_read(tmp_path: Path, monkeypatch, capsys) -> None:
    """A resumed run listed only the unreadable files it wrote itself: those of the run it resumed were "kept" and went
    unsaid, so a copy finished in two runs could hold empty files nobody was told of."""
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    (src / "train" / "a" / "gone.JPEG").symlink_to(tmp_path / "nowhere.JPEG")  # the first file: written empty
    real, calls = resize_dataset.resize_one, []

    def dies_after_three(*args):  # noqa: ANN002 - before broken.JPEG, the sixth file
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(resize_dataset, "resize_one", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
    monkeypatch.undo()
    with open(dst / resize_dataset.OUTCOMES, "ab") as log:
        log.write(b'{"file": "train/a/gr')  # a line a kill cut short: the resumed run's first line must not join it
    capsys.readouterr()
    resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
    out = capsys.readouterr().out
    assert "1 file(s) whose bytes could not be read (a dangling link, no permission) were written as empty files, " \
        "which the loader reports as bad images (1 of them by an earlier run): train/a/gone.JPEG;" in out  # fmt: skip
    assert "1 file(s) PIL could not read were copied unchanged: train/b/broken.JPEG" in out
    # Readable now, deleted from the copy and written again: off the list, in that run and the ones after it.
    _jpeg(tmp_path / "nowhere.JPEG", _noise(300, 300))
    (dst / "train" / "a" / "gone.JPEG").unlink()
    for _ in range(2):
        resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
        out = capsys.readouterr().out
        assert "gone.JPEG" not in out and "written as empty" not in out
        assert "1 file(s) PIL could not read were copied unchanged (1 of them by an earlier run): train/b/broken" in out
    assert (dst / "train" / "a" / "gone.JPEG").stat().st_size > 0


def test_a_run_killed_with_sigkill_leaves_no_worker_holding_the_lock(tmp_path: Path) -> None:
    """The pool's workers inherited the lock and outlived a killed run, waiting for work forever: every resume was
    refused as "another run is writing". They now die with the run."""
    import signal
    import subprocess
    import sys
    import time

    src, dst = tmp_path / "src", tmp_path / "dst"
    for i in range(240):
        _jpeg(src / "train" / f"c{i % 2}" / f"{i}.JPEG", _noise(600, 500))
    run = subprocess.Popen(
        [sys.executable, str(Path(resize_dataset.__file__)), str(src), str(dst), "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not any((dst / "train").rglob("*.JPEG")) if (dst / "train").is_dir() else True:
        assert run.poll() is None and time.monotonic() < deadline, "the run never started writing"
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait(30)
    deadline = time.monotonic() + 30
    with open(dst / resize_dataset.LOCK, "a") as lock:
        while True:  # the workers are gone once the lock is free
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "a worker of the killed run still holds the lock"
                time.sleep(0.1)
    counts = resize_dataset.resize_folder(src, dst, 256, 90, workers=1)
    assert sum(counts.values()) == 240 and counts["kept"] >= 1


def test_a_file_that_cannot_be_read_and_a_class_without_images_keep_the_sources_layout(tmp_path: Path, capsys) -> None:
    """A dangling link crashed the tool (its bytes could not be copied either), so the copy never completed; a class
    folder without images was left out of the copy, which then had other classes and labels than the source."""
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    (src / "train" / "b" / "gone.JPEG").symlink_to(tmp_path / "nowhere.JPEG")
    (src / "train" / "c").mkdir()
    (src / "val" / "c").mkdir()
    (src / "train" / "c" / "notes.txt").write_text("no image here")
    resize_dataset.main([str(src), str(dst), "--workers", "1"])
    assert (dst / "train" / "b" / "gone.JPEG").read_bytes() == b""
    out = capsys.readouterr().out
    assert "1 file(s) whose bytes could not be read (a dangling link, no permission) were written as empty" in out
    assert "train/b/gone.JPEG; once they are readable, delete them from" in out
    assert "1 written empty (unreadable bytes)" in out
    assert sorted(p.name for p in (dst / "train").iterdir()) == ["a", "b", "c"]
    with pytest.raises(FileNotFoundError, match="classes c"):  # refused as the source is: a class without images
        ImageNetDataModule(root=str(dst), workers=0, batch_size=2).setup("fit")


def test_the_pool_runs_under_the_forkserver_start_method(tmp_path: Path) -> None:
    """The workers' start compared their parent with the run's pid: under forkserver (Python 3.14's default on Linux)
    the parent is the forkserver, and every worker exited at once. (Fork is this Python's default, which every other
    test of the pool runs.)"""
    method = "forkserver"
    import subprocess
    import sys

    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    code = (
        "import multiprocessing, sys\n"
        "if __name__ == '__main__':\n"
        f"    multiprocessing.set_start_method({method!r})\n"
        "    import resize_dataset\n"
        "    resize_dataset.main(sys.argv[1:])\n"
    )
    script = tmp_path / "run.py"
    script.write_text(code)
    root = Path(resize_dataset.__file__).parent
    done = subprocess.run(
        [sys.executable, str(script), str(src), str(dst), "--workers", "2"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((dst / resize_dataset.MANIFEST).read_text())["complete"] is True


def test_an_error_writing_the_copy_stops_the_run(tmp_path: Path, monkeypatch) -> None:
    """Only the source's read makes an empty placeholder: a full disk while writing the copy of an unreadable file was
    taken for an unreadable source, and the run ended "complete" with an empty file."""
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    real = Path.write_bytes

    def full(self: Path, data: bytes) -> int:
        if self.name.startswith(".broken.JPEG"):
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError, match="No space left"):
        resize_dataset.main([str(src), str(dst), "--workers", "1"])
    assert json.loads((dst / resize_dataset.MANIFEST).read_text())["complete"] is False
    assert not (dst / "train" / "b" / "broken.JPEG").exists()


def test_a_name_as_long_as_the_source_holds_and_a_manifest_write_cut_short(tmp_path: Path) -> None:
    src, dst = source_folder(tmp_path / "src"), tmp_path / "dst"
    long = src / "train" / "a" / ("x" * 245 + ".JPEG")  # its temporary name would pass the 255-byte limit
    _jpeg(long, _noise(400, 300))
    dst.mkdir()
    (dst / f".{resize_dataset.MANIFEST}.4242.0badc0de.tmp").write_text("{")  # a first manifest write, killed
    resize_dataset.main([str(src), str(dst), "--workers", "1"])
    assert Image.open(dst / "train" / "a" / long.name).size == (341, 256)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=r"file is a file, so the destination .*file/copy cannot be made in it"):
        resize_dataset.main([str(src), str(tmp_path / "file" / "copy"), "--workers", "1"])


def test_the_pixel_limit_is_the_training_loaders_from_the_first_file_on() -> None:
    # Checked in a fresh interpreter: PIL's limit is process-wide and other tests may have raised it already.
    code = "import resize_dataset, image_loading; from PIL import Image; print(Image.MAX_IMAGE_PIXELS)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    from image_loading import MAX_PIXELS

    assert int(out) >= MAX_PIXELS > 89_478_485  # PIL's own default would refuse images the loader takes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--short-side", "16"], "--short-side 16: must be at least 32"),
        (["--quality", "0"], "--quality 0: must be in 1-95"),
        (["--quality", "100"], "--quality 100: must be in 1-95"),
        (["--workers", "0"], "--workers 0: must be at least 1"),
    ],
)
def test_bad_options_name_the_valid_range(argv, message, capsys) -> None:
    with pytest.raises(SystemExit):
        resize_dataset.parse(["src", "dst", *argv])
    assert message in capsys.readouterr().err


def test_the_copy_trains_through_the_data_module(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for split, count in (("train", 6), ("val", 2)):
        for label in ("a", "b"):
            for k in range(count):
                _jpeg(src / split / label / f"{k}.JPEG", _noise(300 + 10 * k, 280))
    dst = tmp_path / "dst"
    resize_dataset.resize_folder(src, dst, 64, 90, workers=1)
    data = ImageNetDataModule(root=str(dst), batch_size=4, workers=0, crop_size=32, val_resize_size=40,
                              val_crop_size=32)  # fmt: skip
    data.setup("fit")
    images, targets = next(iter(data.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and targets.shape == (4,)
    assert data.num_classes == 2 and len(data.val_set) == 4


def test_pil_decode_rate_prints_one_row_per_folder_and_decoder(tmp_path: Path, capsys, monkeypatch) -> None:
    src = tmp_path / "src"
    for k in range(4):
        _jpeg(src / "train" / "a" / f"{k}.JPEG", _noise(400, 300))
    dst = tmp_path / "dst"
    resize_dataset.resize_folder(src, dst, 128, 90, workers=1)
    monkeypatch.setattr(sys, "argv", ["pil_decode_rate.py", "--data", str(src), str(dst), "--repeats", "1"])
    runpy.run_path(str(ROOT / "bench" / "pil_decode_rate.py"), run_name="__main__")
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {tmp_path}")]
    assert [row.split(" | ")[:2] for row in rows] == [[f"| {src}", "pil"], [f"| {dst}", "pil"]]
    assert rows[0].endswith("| 1.00 |")
    assert rows[1].split(" | ")[3] == "22 k"  # 171 x 128 pixels per file, down from 120 k
    # Both decoders, in two processes at once: one row per folder and decoder.
    argv = ["--data", str(dst), "--decoders", "pil", "torchvision", "--processes", "2", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", ["pil_decode_rate.py", *argv])
    runpy.run_path(str(ROOT / "bench" / "pil_decode_rate.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "2 processes at once, all their images over the window" in out
    rows = [line.split(" | ")[:2] for line in out.splitlines() if line.startswith(f"| {tmp_path}")]
    assert rows == [[f"| {dst}", "pil"], [f"| {dst}", "torchvision"]]
    monkeypatch.setattr(sys, "argv", ["pil_decode_rate.py", "--data", str(dst), "--processes", "0"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(ROOT / "bench" / "pil_decode_rate.py"), run_name="__main__")
    assert "--processes must be >= 1, got 0" in capsys.readouterr().err
    (dst / "train" / "a" / "3.JPEG").unlink()
    monkeypatch.setattr(sys, "argv", ["pil_decode_rate.py", "--data", str(src), str(dst)])
    with pytest.raises(SystemExit):
        runpy.run_path(str(ROOT / "bench" / "pil_decode_rate.py"), run_name="__main__")
    assert "1 of the sampled files are not there (first: train/a/3.JPEG)" in capsys.readouterr().err


def test_image_files_are_the_files_the_dataset_finds(tmp_path: Path) -> None:
    src = source_folder(tmp_path / "src")
    linked = tmp_path / "elsewhere"
    _jpeg(linked / "deep.JPEG", _noise(300, 300))
    (src / "train" / "a" / "linked").symlink_to(linked, target_is_directory=True)
    names = [str(p) for p in resize_dataset.image_files(src)]
    for split in ("train", "val"):
        dataset = VisibleImageFolder(str(src / split), loader=lambda path: path)
        assert sorted(n for n in names if n.startswith(f"{split}/")) == sorted(
            str(Path(path).relative_to(src)) for path, _ in dataset.samples
        )
    assert "train/a/linked/deep.JPEG" in names and "train/b/notes.txt" not in names
    assert len(names) == 10  # 8 train images (one behind a link) and 2 val images


def test_a_large_jpeg_is_decoded_at_a_reduced_size_and_matches_a_full_size_resize(tmp_path: Path) -> None:
    y, x = np.mgrid[0:1200, 0:1800]
    smooth = np.stack([x * 255 / 1800, y * 255 / 1200, (x + y) * 255 / 3000], -1).astype(np.uint8)
    src = _jpeg(tmp_path / "big.JPEG", Image.fromarray(smooth))
    assert resize_dataset.resize_one(src, tmp_path / "out.JPEG", 256, 90) == "resized"
    out = np.asarray(Image.open(tmp_path / "out.JPEG"), dtype=np.float64)
    full = np.asarray(Image.open(src).resize((384, 256), Image.Resampling.BICUBIC), dtype=np.float64)
    assert out.shape == (256, 384, 3) and np.abs(out - full).mean() < 2.0
