"""Video data: the synthetic generator, frame folders, splits, patches, sequences and noise."""

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cudt.data import (
    DataError,
    VideoSplits,
    load_frame_folders,
    load_video_data,
    make_sequences,
    patchify,
    perturb,
    split_train_val,
    split_videos,
    synthetic_videos,
    unpatchify,
)

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------------
# Synthetic videos
# --------------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_per_seed_and_video():
    a = synthetic_videos(3, 6, size=64, seed=3)
    b = synthetic_videos(3, 6, size=64, seed=3)
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, synthetic_videos(3, 6, size=64, seed=4))
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[1], a[2])
    # Video v depends on (seed, v) only: fewer videos or frames give the same content.
    np.testing.assert_array_equal(synthetic_videos(1, 6, size=64, seed=3)[0], a[0])
    np.testing.assert_array_equal(synthetic_videos(3, 4, size=64, seed=3), a[:, :4])


def test_synthetic_shape_range_dtype():
    v = synthetic_videos(2, 5)
    assert v.shape == (2, 5, 160, 160) and v.dtype == np.float32
    assert v.min() >= 0.0 and v.max() <= 1.0
    assert v.std() > 0.05  # textured, not flat


def test_synthetic_objects_move_over_a_static_background():
    v = synthetic_videos(4, 20, seed=1)
    diff = np.abs(np.diff(v, axis=1))  # [V, F-1, S, S]
    for i in range(len(v)):
        # Background: drift is sub-pixel, so most pixels barely change; objects change a lot.
        assert np.median(diff[i]) < 0.01, i
        assert diff[i].max() > 0.3, i
        moving = (diff[i] > 0.1).mean()
        assert 1e-3 < moving < 0.1, (i, moving)
        # Motion in every frame step, not just somewhere in the clip.
        assert (diff[i].max(axis=(1, 2)) > 0.1).all(), i


def test_synthetic_rejects_bad_arguments():
    with pytest.raises(DataError, match="num_frames"):
        synthetic_videos(2, 0)
    with pytest.raises(DataError, match="seed"):
        synthetic_videos(2, 2, seed=-1)


# --------------------------------------------------------------------------------------------------
# Patches and sequences
# --------------------------------------------------------------------------------------------------


def position_frame(h=32, w=48):
    rows, cols = np.mgrid[0:h, 0:w]
    return (rows * 1000 + cols).astype(np.float32)  # value encodes (row, col)


def test_patchify_order_and_roundtrip():
    frame = position_frame()
    p = patchify(frame, 16)  # [6, 256]
    assert p.shape == (6, 256)
    for k in range(6):
        ph, pw = divmod(k, 3)  # row-major patches
        for e in (0, 1, 15, 16, 17, 255):
            r, c = divmod(e, 16)  # row-major within the patch
            assert p[k, e] == (ph * 16 + r) * 1000 + pw * 16 + c
    batch = np.stack([frame, frame + 1, frame + 2])[None].repeat(2, 0)  # [2, 3, 32, 48]
    patches = patchify(batch, 16)
    assert patches.shape == (2, 3, 6, 256)
    np.testing.assert_array_equal(unpatchify(patches, 32, 48), batch)
    # Same on jax arrays.
    np.testing.assert_array_equal(np.asarray(patchify(jnp.asarray(batch), 16)), patches)
    np.testing.assert_array_equal(np.asarray(unpatchify(jnp.asarray(patches), 32, 48)), batch)
    # Other patch sizes.
    np.testing.assert_array_equal(unpatchify(patchify(frame, 8), 32, 48), frame)


def test_patchify_rejects_indivisible_sizes():
    with pytest.raises(DataError, match="not divisible by patch=16"):
        patchify(np.zeros((30, 32)), 16)
    with pytest.raises(DataError, match="do not tile"):
        unpatchify(np.zeros((6, 256)), 32, 32)


def test_make_sequences_shapes_and_content():
    rng = np.random.default_rng(0)
    v0 = rng.random((10, 32, 32), dtype=np.float32)
    v1 = rng.random((7, 32, 32), dtype=np.float32)
    seqs = make_sequences([v0, v1], 3, stride=2)
    # v0: windows at 0, 2, 4, 6; v1: at 0, 2, 4; 4 patches each.
    assert seqs.shape == ((4 + 3) * 4, 3, 256) and seqs.dtype == np.float32
    for video, offset, n_windows in ((v0, 0, 4), (v1, 16, 3)):
        for w in range(n_windows):
            for k in range(4):
                expected = patchify(video[2 * w : 2 * w + 3], 16)[:, k]  # [T, P]
                np.testing.assert_array_equal(seqs[offset + w * 4 + k], expected)
    # Default stride = seq_len: disjoint windows; an array of videos works too.
    assert make_sequences(np.stack([v0, v0]), 3).shape == (2 * 3 * 4, 3, 256)
    assert make_sequences([synthetic_videos(1, 8)[0]], 8).shape == (100, 8, 256)


def test_make_sequences_too_few_frames():
    with pytest.raises(DataError, match=r"video 1 has 2 frames, too few frames for one sequence"):
        make_sequences([np.zeros((5, 16, 16)), np.zeros((2, 16, 16))], 4)


def test_split_by_video():
    videos = [np.full((2, 16, 16), i, np.float32) for i in range(10)]
    train, val, test = split_videos(videos)
    ids = [[int(v[0, 0, 0]) for v in part] for part in (train, val, test)]
    assert sorted(sum(ids, [])) == list(range(10))  # disjoint and complete
    assert all(len(part) >= 1 for part in ids) and len(ids[0]) == 7
    assert [[int(v[0, 0, 0]) for v in p] for p in split_videos(videos)] == ids
    # Three videos: one each; arrays stay arrays.
    tr, va, te = split_videos(np.arange(3)[:, None, None, None] * np.ones((3, 2, 4, 4)))
    assert [len(tr), len(va), len(te)] == [1, 1, 1] and isinstance(tr, np.ndarray)
    with pytest.raises(DataError, match="at least 3 videos"):
        split_videos(videos[:2])


# --------------------------------------------------------------------------------------------------
# Frame folders
# --------------------------------------------------------------------------------------------------


def write_video(folder: Path, values, size=(48, 36), suffix=".tif", names=None):
    folder.mkdir(parents=True)
    names = names or [f"{i + 1:03d}" for i in range(len(values))]
    for name, value in zip(names, values, strict=True):
        Image.new("L", size, int(value)).save(folder / f"{name}{suffix}")


def ucsd_tree(root: Path) -> Path:
    ped2 = root / "UCSDped2"
    write_video(ped2 / "Train" / "Train001", [10, 20, 30])
    # Unpadded names: natural order must put 2 before 10.
    write_video(ped2 / "Train" / "Train002", [40, 50, 60], names=["1", "2", "10"])
    write_video(ped2 / "Test" / "Test001", [70, 80, 90])
    write_video(ped2 / "Test" / "Test001_gt", [255, 0, 255], suffix=".bmp")
    write_video(ped2 / "Test" / "Test002", [100, 110, 120])
    (ped2 / "Test" / "Test001" / "README.txt").write_text("not a frame")
    (ped2 / "Test" / "Test001" / ".DS_Store").write_bytes(b"\x00junk")
    (ped2 / "Test" / "UCSDped2.m").write_text("% matlab file")
    return ped2


def expected_video(values, size=160):
    return np.stack([np.full((size, size), np.float32(v) / np.float32(255.0)) for v in values])


def test_reads_ucsd_layout(tmp_path):
    ped2 = ucsd_tree(tmp_path)
    for root in (tmp_path, ped2):
        data = load_frame_folders(root)
        assert set(data) == {"train", "test"}
        assert [v.shape for v in data["train"]] == [(3, 160, 160)] * 2
        assert len(data["test"]) == 2  # Test001_gt is not a video
        for got, values in zip(
            data["train"] + data["test"],
            ([10, 20, 30], [40, 50, 60], [70, 80, 90], [100, 110, 120]),
            strict=True,
        ):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, expected_video(values))
    small = load_frame_folders(tmp_path, size=32, max_videos=1, max_frames=2)
    assert len(small["train"]) == 1 and small["train"][0].shape == (2, 32, 32)


def test_reads_generic_frame_layout(tmp_path):
    write_video(tmp_path / "avenue" / "training" / "frames" / "01", [5, 6], suffix=".jpg")
    write_video(tmp_path / "avenue" / "testing" / "frames" / "01", [7, 8, 9], suffix=".png")
    data = load_frame_folders(tmp_path, dataset="frames", size=16)
    assert [v.shape for v in data["train"]] == [(2, 16, 16)]
    np.testing.assert_array_equal(data["test"][0], expected_video([7, 8, 9], 16))
    # ShanghaiTech's extracted frames keep their masks beside frames/: not videos
    masks = tmp_path / "avenue" / "testing" / "test_frame_mask"
    masks.mkdir()
    (masks / "01_0014.npy").write_bytes(b"\x93NUMPY")
    write_video(tmp_path / "avenue" / "testing" / "test_pixel_mask" / "01_0014", [1], suffix=".png")
    assert len(load_frame_folders(tmp_path, dataset="frames", size=16)["test"]) == 1
    # JPEG of a constant frame decodes to (almost) the constant.
    np.testing.assert_allclose(data["train"][0], expected_video([5, 6], 16), atol=2 / 255)


def test_frames_of_more_than_8_bits_are_scaled_not_clipped(tmp_path):
    """16-bit TIFF and PNG frames are scaled by 1/65535 and float TIFF frames read as they
    are: converted to 8 bits they were clipped to 0-255 (a 12-bit frame came out nearly white,
    a float one black)."""
    video = tmp_path / "UCSDped2" / "Train" / "Train001"
    video.mkdir(parents=True)
    ramp = np.arange(32 * 32, dtype=np.float64).reshape(32, 32) / (32 * 32 - 1)
    twelve, sixteen = (ramp * 4095).astype(np.uint16), (ramp * 65535).astype(np.uint16)
    Image.fromarray(twelve).save(video / "001.tif")  # 12 bits in a 16-bit TIFF
    Image.fromarray(sixteen).save(video / "002.png")
    Image.fromarray(ramp.astype(np.float32)).save(video / "003.tif")
    write_video(tmp_path / "UCSDped2" / "Test" / "Test001", [10])
    (got,) = load_frame_folders(tmp_path, size=32)["train"]
    np.testing.assert_allclose(got[0], twelve / 65535, atol=1e-6)
    np.testing.assert_allclose(got[1], sixteen / 65535, atol=1e-6)
    np.testing.assert_allclose(got[2], ramp, atol=1e-6)
    # resized as the 8-bit frames are (bilinear), on the same scale
    half = load_frame_folders(tmp_path, size=16)["train"][0]
    assert 0.45 < half[1].mean() < 0.55 and abs(half[1].mean() - half[2].mean()) < 1e-4


def test_frame_order_does_not_depend_on_the_listing(tmp_path, monkeypatch):
    """Names that compare equal as numbers (``1.tif`` and ``001.tif``, ``Train001`` and
    ``train001``) are ordered by the name itself, whatever order the file system lists them in."""
    ped2 = tmp_path / "UCSDped2"
    write_video(ped2 / "Train" / "Train001", [10, 20])
    write_video(ped2 / "Train" / "train001", [30, 40])
    write_video(ped2 / "Train" / "Train002", [50, 60], names=["001", "1"])
    write_video(ped2 / "Test" / "Test001", [70])
    listing = Path.iterdir
    reads = []
    for order in (lambda xs: xs, lambda xs: xs[::-1]):
        monkeypatch.setattr(Path, "iterdir", lambda self, o=order: iter(o(sorted(listing(self)))))
        reads.append(load_frame_folders(tmp_path, size=8)["train"])
    for a, b in zip(*reads, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [float(v[0, 0, 0]) * 255 for v in reads[0]] == pytest.approx([10, 30, 50])


@pytest.mark.parametrize("names", [("UCSDped1", "UCSDped2"), ("ped1", "ped2")])
def test_each_ucsd_camera_gives_its_own_validation_videos(tmp_path, names):
    """The whole UCSD archive (Ped1 and Ped2): each camera's training videos are split apart,
    so validation holds both (read as one list, its last videos were Ped2's alone), and
    ``max_videos`` caps each camera (it read Ped1's alone); the same where the cameras' folders
    were renamed (they were read as one list then)."""
    for camera, value in zip(names, (40, 200), strict=True):
        for i in range(1, 8):
            write_video(tmp_path / camera / "Train" / f"Train{i:03d}", [value] * 4)
        write_video(tmp_path / camera / "Test" / "Test001", [value] * 4)
    data = load_video_data("ucsd", tmp_path, seq_len=4, size=16, stride=4)
    assert f"{names[0]}, {names[1]}, split apart" in data.source

    def cameras(sequences):
        return sorted({round(float(v) * 255) for v in sequences[:, 0, 0]})

    assert cameras(data.val) == [40, 200] and cameras(data.test) == [40, 200]
    assert len(data.val) == 2 and len(data.train) == 2 * 6  # a sequence a video; 1 of 7 each
    capped = load_video_data("ucsd", tmp_path, seq_len=4, size=16, stride=4, max_videos=2)
    assert cameras(capped.train) == [40, 200] and cameras(capped.val) == [40, 200]
    one = load_video_data("ucsd", tmp_path / names[1], seq_len=4, size=16, stride=4)
    assert cameras(one.val) == [200] and "split apart" not in one.source


def test_max_videos_help_says_what_it_caps(tmp_path):
    """--max-videos's help (the video task's and the table's) is what the reader does: it caps
    the training and the test videos apart, and each camera of a UCSD folder holding both (the
    help said "per split": --max-videos 2 read 4 training and 4 test videos here)."""
    import dataclasses

    from cudt.tasks.video import VideoConfig, VideoTask
    from experiments.paper.video_table.config import Table3Config

    for cls in (VideoConfig, Table3Config):
        (field,) = [f for f in dataclasses.fields(cls) if f.name == "max_videos"]
        text = " ".join(field.metadata["help"].split())
        assert "training and this many test videos" in text, text
        assert "per camera of a UCSD folder holding both UCSDped1 and UCSDped2" in text, text
    for c, camera in enumerate(("UCSDped1", "UCSDped2")):
        for i in range(1, 4):
            write_video(tmp_path / camera / "Train" / f"Train{i:03d}", [40 * c + 10 * i] * 4)
            write_video(tmp_path / camera / "Test" / f"Test{i:03d}", [100 + 40 * c + 10 * i] * 4)
    cfg = VideoConfig(dataset="ucsd", data_dir=str(tmp_path), seq_len=4, max_videos=2)
    data = VideoTask().load(cfg)

    def videos(*splits):  # one value a video
        return sorted({round(float(v) * 255) for s in splits for v in s[:, 0, 0]})

    assert videos(data.train, data.val) == [10, 20, 50, 60]  # 2 a camera, the first by name
    assert videos(data.test) == [110, 120, 150, 160]


def test_load_video_data_from_folders(tmp_path):
    ucsd_tree(tmp_path)
    data = load_video_data("ucsd", tmp_path, seq_len=2, size=32)
    # val comes from the training videos: train = Train001, val = Train002 (the last by name);
    # test = Test001 + Test002. One window x 4 patches per video.
    assert data.train.shape == (4, 2, 256) and data.val.shape == (4, 2, 256)
    assert data.test.shape == (8, 2, 256)
    np.testing.assert_array_equal(data.train[:, 1], np.float32(20) / np.float32(255))
    np.testing.assert_array_equal(data.val[:, 0], np.float32(40) / np.float32(255))
    np.testing.assert_array_equal(data.test[:4, 0], np.float32(70) / np.float32(255))
    np.testing.assert_array_equal(data.test[4:, 1], np.float32(110) / np.float32(255))
    assert data.sigma == pytest.approx(float(np.std(data.train)), rel=1e-6)
    assert data.source.startswith("ucsd:")


def test_the_frames_no_sequence_holds_are_counted_and_said(tmp_path):
    """A video's last F mod T frames fill no sequence and were left out without a word (a
    12-frame video at --seq-len 8: a third of it); the data line now counts them."""
    from cudt.data.video.splits import _unused_frames
    from cudt.tasks.video import VideoConfig, VideoTask

    for frames, seq_len, stride in [(12, 8, 8), (16, 8, 8), (10, 3, 2), (10, 3, 5), (2, 3, 3)]:
        starts = range(0, frames - seq_len + 1, stride)
        covered = {f for s in starts for f in range(s, s + seq_len)}
        assert _unused_frames(frames, seq_len, stride) == frames - len(covered)
    ucsd_tree(tmp_path)  # four videos of 3 frames: at seq_len 2 each leaves its last one out
    data = load_video_data("ucsd", tmp_path, seq_len=2, size=32)
    assert (data.num_frames, data.unused_frames) == (12, 4)
    cfg = VideoConfig(dataset="ucsd", data_dir=str(tmp_path), seq_len=2)
    (line,) = VideoTask().describe(cfg, VideoTask().load(cfg))
    assert line.endswith(
        "; 4 of 12 frames fill no whole sequence of 2 (each video's last frames) and are left out"
    )
    whole = load_video_data(seq_len=4, num_videos=3, num_frames=8, size=32)  # 8 = 2 x 4
    assert (whole.num_frames, whole.unused_frames) == (24, 0)


def test_a_real_data_set_is_the_same_footage_at_every_seed(tmp_path):
    """docs/runner.md: a real video data set is split by name, so its seeds read the same
    videos (the page said each seed drew its own split of the videos); the synthetic clips are
    drawn per seed."""
    ucsd_tree(tmp_path)
    a, b = (load_video_data("ucsd", tmp_path, seq_len=2, size=32, seed=s) for s in (0, 1))
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(a, split), getattr(b, split))
    x, y = (load_video_data(seq_len=2, num_videos=3, num_frames=2, size=32, seed=s) for s in (0, 1))
    assert not np.array_equal(x.train, y.train)
    page = " ".join((ROOT / "docs" / "runner.md").read_text().split())
    assert "split by video name, the same at every seed" in page
    assert "the train/validation/test split of the videos" not in page


def test_the_runner_says_when_its_seeds_read_the_same_training_examples(tmp_path, capsys):
    """The runner headed each seed's data line "fresh per seed" on a real data set too, whose
    seeds read the same videos: it now says so, where the draws' training examples agree."""
    from cudt.runner.cli import config_from_args
    from cudt.runner.run import _load_draws, data_draws
    from cudt.tasks.video import VideoConfig, VideoTask

    ucsd_tree(tmp_path)
    tiny = ["--seq-len", "2", "--seeds", "2", "--models", "ut"]
    for flags, fresh in (
        (["--dataset", "ucsd", "--data-dir", str(tmp_path)], False),
        (["--num-videos", "3", "--num-frames", "4"], True),
    ):
        cfg, _ = config_from_args(VideoConfig, [*tiny, *flags], "", "x")
        _, record = _load_draws(VideoTask(), data_draws(cfg))
        heads = [ln for ln in capsys.readouterr().out.splitlines() if "'s data" in ln]
        assert [h.split(" (")[0] for h in heads] == ["seed 0's data", "seed 1's data"], heads
        assert all(("fresh per seed" in h) == fresh for h in heads), heads
        assert all(("the same training examples" in h) != fresh for h in heads), heads
        assert len(record["data_per_seed"]) == 2


def test_a_training_frame_edited_changes_the_fingerprint_a_resume_checks(tmp_path):
    """A training frame that no sequence holds (a video's last frames, past its last window)
    is one the ViT trains on: edited or re-extracted, the data's fingerprint (what a resumed
    run is checked against) changed nowhere, sigma_x and the shape being the same."""
    from cudt.tasks.video import VideoData, VideoTask

    write_video(tmp_path / "train" / "01", [10, 20, 30, 40, 50])  # windows of 2: frames 1-4
    write_video(tmp_path / "train" / "02", [60, 70])
    write_video(tmp_path / "test" / "01", [80, 90])

    def fingerprint():
        splits = load_video_data("frames", tmp_path, seq_len=2, size=16, keep_frames=True)
        data = VideoData(**{k: getattr(splits, k) for k in VideoSplits.__dataclass_fields__})
        return VideoTask().fingerprint(None, data)

    before = fingerprint()
    assert fingerprint() == before  # the same folder, the same fingerprint
    Image.new("L", (48, 36), 99).save(tmp_path / "train" / "01" / "005.tif")
    after = fingerprint()
    assert after["sigma_x"] == before["sigma_x"] and after["train_shape"] == before["train_shape"]
    assert after["train_digest"] != before["train_digest"]


@pytest.mark.parametrize("keep_frames", [False, True])
def test_the_memory_check_counts_the_peak_that_preparing_the_data_holds(
    tmp_path, monkeypatch, keep_frames
):
    """What load_video_data holds at its peak (measured: the decoded frames, the sequences
    joined, the float64 pass of sigma_x over the training sequences and, for the ViT,
    keep_frames' copy of the frames) is what the check before decoding counts: with less
    memory available than that peak the videos are refused, not read into an OOM."""
    import tracemalloc

    from cudt.data.video import frames

    for split, videos in (("train", 6), ("test", 3)):
        for v in range(videos):
            write_video(tmp_path / split / f"{v:02d}", [(v * 7 + i) % 255 for i in range(16)])
    monkeypatch.setattr(frames, "available_memory", lambda: None)  # unknown: not checked

    def load():
        return load_video_data("frames", tmp_path, seq_len=4, size=32, keep_frames=keep_frames)

    load()  # the imports and caches a first call makes, out of the measure
    tracemalloc.start()
    try:
        data = load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    frames_bytes = 9 * 16 * 32 * 32 * 4  # every decoded float32 frame
    assert peak > 2 * frames_bytes + (frames_bytes if keep_frames else 0)  # more than 8 B/pixel
    assert (data.frames is not None) == keep_frames
    monkeypatch.setattr(frames, "available_memory", lambda: peak - 1)
    with pytest.raises(DataError, match="need about .* of memory at 32x32"):
        load()


def _vit_run(tmp_path):
    """A ViT run's folder over a ViT folder written at seed 0: ``resume()`` opens the folder as
    the runner does and says whether it resumes (the first call writes the record)."""
    from cudt.models.vit.weights import write_vit_folder
    from cudt.runner.output import checkpoint_record, open_output_once
    from cudt.tasks.video import VideoConfig, VideoTask

    folder = write_vit_folder(tmp_path / "vit", seed=0)
    out = tmp_path / "run"
    cfg = VideoConfig(
        models=("vit",), vit_checkpoint=str(folder), num_videos=3, num_frames=8, seq_len=4
    )
    task = VideoTask()

    def resume() -> bool:
        record = checkpoint_record(cfg) | task.fingerprint(cfg, task.load(cfg))
        with open_output_once(out, record, cfg, main_process=True) as opened:
            return opened.resuming

    return folder, out, resume


def test_the_data_line_names_the_frames_the_vit_reads(tmp_path):
    """The ViT trains on whole frames; the data line counted only the patch sequences DUST and
    the UT read ("train 100 / val 100 / test 100 sequences of 4x256" for 8 frames a split)."""
    from cudt.models.vit.weights import write_vit_folder
    from cudt.tasks.video import VideoConfig, VideoTask

    folder = write_vit_folder(tmp_path / "vit", seed=0)
    task = VideoTask()
    cfg = VideoConfig(
        models=("vit",), vit_checkpoint=str(folder), num_videos=3, num_frames=8, seq_len=4
    )
    lines = task.describe(cfg, task.load(cfg))
    assert lines[0].startswith("data: synthetic(") and "sequences of 4x256" in lines[0]
    assert lines[1] == "the ViT's data: train 8 / val 8 / test 8 whole frames of 160x160"
    odd = dataclasses.replace(cfg, num_frames=7)  # 7 = 4 + 3: each video's last 3 frames
    head = task.describe(odd, task.load(odd))[0]  # are in no sequence, in the ViT's frames
    assert head.endswith("are left out of the sequences (the ViT's whole frames hold them)")
    plain = VideoConfig(num_videos=3, num_frames=8, seq_len=4)
    assert len(task.describe(plain, task.load(plain))) == 1  # no ViT: the sequences alone


def test_other_vit_weights_at_the_same_path_are_refused_on_resume_older_runs_resume(tmp_path):
    """The ViT's pretrained weights are in the fingerprint (vit_digest), as the text encoder's
    are: a resume with other weights written to the same --vit-checkpoint folder is refused
    (its models not yet started would start from them); a run recorded before the digest
    resumes (a *_digest one side lacks is not compared)."""
    import json

    from cudt.errors import UsageError
    from cudt.models.vit.weights import write_vit_folder

    folder, out, resume = _vit_run(tmp_path)
    assert not resume()  # a fresh folder: its record written
    (out / "checkpoints" / "vit-12" / "4").mkdir(parents=True)  # a step saved
    assert resume()
    saved = out / "checkpoints" / "config.json"
    assert "vit_digest" in json.loads(saved.read_text())
    write_vit_folder(folder, seed=1)  # other weights, the same path
    refused = r"trained on other files than its flags name now \(vit_digest"
    with pytest.raises(UsageError, match=refused):
        resume()
    older = {k: v for k, v in json.loads(saved.read_text()).items() if k != "vit_digest"}
    saved.write_text(json.dumps(older))  # as a run from before the digest recorded it
    assert resume()


def test_another_vit_config_at_the_same_path_is_refused_on_resume_older_runs_resume(tmp_path):
    """The ViT's config.json and preprocessor_config.json are in the fingerprint
    (vit_config_digest): the same weights under another pixel mean/std or activation are
    another model, and a resume over them is refused; a run recorded before the digest
    resumes."""
    import json

    from cudt.errors import UsageError

    folder, out, resume = _vit_run(tmp_path)
    assert not resume()
    (out / "checkpoints" / "vit-12" / "4").mkdir(parents=True)  # a step saved
    saved = out / "checkpoints" / "config.json"
    pre = folder / "preprocessor_config.json"
    original = pre.read_text()
    pre.write_text(json.dumps(json.loads(original) | {"image_mean": [0.485, 0.456, 0.406]}))
    refused = r"trained on other files than its flags name now \(vit_config_digest"
    with pytest.raises(UsageError, match=refused):
        resume()
    pre.write_text(original)
    assert resume()  # the same files again
    config = folder / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"hidden_act": "relu"}))
    with pytest.raises(UsageError, match=refused):
        resume()
    older = {k: v for k, v in json.loads(saved.read_text()).items() if k != "vit_config_digest"}
    saved.write_text(json.dumps(older))  # as a run from before the digest recorded it
    assert resume()


def test_split_train_val():
    videos = [np.full((4, 16, 16), i, np.float32) for i in range(20)]
    for n, n_val in ((2, 1), (3, 1), (7, 1), (10, 2), (16, 2), (20, 3)):
        train, val = split_train_val(videos[:n], seq_len=2)
        assert [int(v[0, 0, 0]) for v in train + val] == list(range(n))  # in order, disjoint
        assert len(val) == n_val, n
    # One video: split in time, the last max(round(0.15 * F), seq_len) frames are val.
    video = np.arange(40, dtype=np.float32)[:, None, None] * np.ones((1, 16, 16), np.float32)
    (train,), (val,) = split_train_val([video], seq_len=2)
    np.testing.assert_array_equal(val[:, 0, 0], np.arange(34, 40))
    np.testing.assert_array_equal(train, video[:34])
    (train,), (val,) = split_train_val([video[:10]], seq_len=4)
    assert (len(train), len(val)) == (6, 4)
    with pytest.raises(DataError, match="only training video has 7 frames.*needs 8"):
        split_train_val([video[:7]], seq_len=4)


def test_one_training_video_in_folders_is_split_in_time(tmp_path):
    write_video(tmp_path / "train" / "01", list(range(10, 110, 10)))  # 10 frames
    write_video(tmp_path / "test" / "01", [200, 210])
    data = load_video_data("frames", tmp_path, seq_len=2, size=16)
    # Frames 0-7 train (4 windows), 8-9 val (1 window), one patch per 16x16 frame.
    assert (data.train.shape, data.val.shape, data.test.shape) == ((4, 2, 256),) + (
        (1, 2, 256),
    ) * 2
    np.testing.assert_array_equal(data.val[0, :, 0], np.float32([90, 100]) / np.float32(255))


def test_no_test_videos(tmp_path):
    write_video(tmp_path / "UCSDped2" / "Train" / "Train001", [10, 20, 30, 40])
    with pytest.raises(DataError) as e:
        load_video_data("ucsd", tmp_path, seq_len=2, size=16)
    assert "need at least 1 test video" in one_line(e) and "add test videos" in one_line(e)


def test_load_video_data_synthetic():
    data = load_video_data("synthetic", seq_len=4, num_videos=4, num_frames=8, size=32, seed=2)
    assert isinstance(data, VideoSplits)
    # 4 videos -> 2/1/1 by video; 2 windows x 4 patches per video.
    assert data.train.shape == (16, 4, 256)
    assert data.val.shape == data.test.shape == (8, 4, 256)
    assert all(x.dtype == np.float32 for x in (data.train, data.val, data.test))
    assert data.sigma == pytest.approx(float(np.std(data.train)), rel=1e-6) and data.sigma > 0
    assert (data.seq_len, data.patch, data.frame_size) == (4, 16, 32)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_missing_folder(tmp_path):
    with pytest.raises(DataError) as e:
        load_frame_folders(tmp_path / "nope")
    assert "does not exist" in one_line(e) and "--data-dir" in one_line(e)


def test_empty_folder(tmp_path):
    (tmp_path / "stuff").mkdir()
    with pytest.raises(DataError) as e:
        load_frame_folders(tmp_path)
    assert "no video folders found" in one_line(e) and "Train001" in one_line(e)
    with pytest.raises(DataError) as e:
        load_frame_folders(tmp_path, dataset="frames")
    assert "{train,test}" in one_line(e)


def test_unreadable_folders_are_one_line_naming_them(tmp_path):
    """A camera folder, or a video folder, the user may not list: one line naming it, where an
    unreadable UCSDped2 was a PermissionError traceback (listing the cameras' folders came
    before the reads that named it). Read in a child process; as root, one without the
    capabilities that read through file permissions."""
    ped2 = ucsd_tree(tmp_path)
    code = (
        "import sys\nfrom cudt.data import DataError, load_video_data\n"
        "try:\n    load_video_data('ucsd', sys.argv[1], seq_len=2, size=16)\n"
        "except DataError as e:\n    print(e)"
    )
    command = [sys.executable, "-c", code, str(tmp_path)]
    if os.geteuid() == 0:
        drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
        if shutil.which("setpriv") is None or subprocess.run([*drop, "true"]).returncode:
            pytest.skip("root that cannot drop its capabilities reads through file permissions")
        command = [*drop, *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    for locked in (ped2, ped2 / "Train" / "Train002"):
        locked.chmod(0)
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        finally:
            locked.chmod(0o755)
        assert done.returncode == 0 and done.stdout.strip() == (
            f"cannot read '{locked}' (Permission denied): check that --data-dir and its files "
            "are readable"
        ), done.stdout + done.stderr


def test_corrupt_frame(tmp_path):
    ped2 = ucsd_tree(tmp_path)
    (ped2 / "Train" / "Train001" / "002.tif").write_bytes(b"this is not a tiff")
    with pytest.raises(DataError) as e:
        load_frame_folders(tmp_path)
    assert "cannot decode frame" in one_line(e) and "002.tif" in one_line(e)


def test_truncated_frame(tmp_path):
    ped2 = ucsd_tree(tmp_path)
    path = ped2 / "Train" / "Train001" / "002.tif"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64), np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(DataError, match="cannot decode frame .*002.tif"):
        load_frame_folders(tmp_path)


def test_mixed_frame_sizes(tmp_path):
    ped2 = ucsd_tree(tmp_path)
    Image.new("L", (50, 36), 0).save(ped2 / "Test" / "Test002" / "004.tif")
    with pytest.raises(DataError) as e:
        load_frame_folders(tmp_path)
    assert "differ in size" in one_line(e) and "Test002" in one_line(e)
    assert "48x36" in one_line(e) and "50x36" in one_line(e)


def test_video_folder_without_frames(tmp_path):
    ped2 = ucsd_tree(tmp_path)
    (ped2 / "Train" / "Train003").mkdir()
    (ped2 / "Train" / "Train003" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="Train003' has no image frames"):
        load_frame_folders(tmp_path)


def test_too_few_frames_for_a_sequence(tmp_path):
    ucsd_tree(tmp_path)
    with pytest.raises(DataError, match="too few frames for one sequence of seq_len=4"):
        load_video_data("ucsd", tmp_path, seq_len=4, size=32)


def test_unknown_dataset_and_missing_data_dir():
    with pytest.raises(DataError) as e:
        load_video_data("kitti")
    assert "unknown dataset 'kitti'" in one_line(e)
    assert "synthetic, ucsd, frames, avenue, shanghaitech" in one_line(e)
    with pytest.raises(DataError, match="needs data_dir"):
        load_video_data("ucsd")


# --------------------------------------------------------------------------------------------------
# Noise
# --------------------------------------------------------------------------------------------------


def test_perturb_statistics_and_exact_zero():
    x = jnp.linspace(0.0, 1.0, 1_000_000, dtype=jnp.float32).reshape(1000, 1000)
    key = jax.random.key(0)
    noise = perturb(x, 0.5, 0.2, key) - x
    assert abs(float(noise.mean())) < 1e-3
    assert float(noise.std()) == pytest.approx(0.1, rel=0.01)
    np.testing.assert_array_equal(perturb(x, 0.0, 0.2, key), x)


def test_perturb_jit_vmap_dtype():
    x = jnp.ones((64, 8, 256), jnp.float32)
    key = jax.random.key(1)
    jitted = jax.jit(perturb)  # gamma and sigma traced
    y = jitted(x, 0.3, 0.5, key)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_allclose(y, perturb(x, 0.3, 0.5, key), rtol=1e-6, atol=1e-6)
    gammas = jnp.array([0.0, 0.5, 1.0])
    ys = jax.vmap(perturb, in_axes=(None, 0, None, None))(x, gammas, 0.5, key)
    assert ys.shape == (3, *x.shape)
    np.testing.assert_array_equal(ys[0], x)
    stds = (ys - x).std(axis=(1, 2, 3))
    np.testing.assert_allclose(stds, 0.5 * gammas, atol=0.01)
    keys = jax.random.split(key, 4)
    assert jax.vmap(perturb, in_axes=(0, None, None, 0))(x[:4], 1.0, 1.0, keys).shape == x[:4].shape
    xb = x.astype(jnp.bfloat16)
    assert perturb(xb, 0.1, 0.2, key).dtype == jnp.bfloat16


def test_perturb_noise_does_not_depend_on_batching():
    x = jnp.zeros((10, 3, 4), jnp.float32)
    key = jax.random.key(7)
    whole = perturb(x, 1.0, 1.0, key)
    parts = jnp.concatenate([perturb(x[:4], 1.0, 1.0, key), perturb(x[4:], 1.0, 1.0, key, 4)])
    np.testing.assert_array_equal(whole, parts)
    assert not np.allclose(whole[0], whole[1])  # samples get different noise
