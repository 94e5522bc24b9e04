"""CUHK Avenue and ShanghaiTech readers on tiny datasets written in the layouts their archives
extract to: real .avi files (PyAV), JPEG frame folders (PIL), ground truth and hidden files beside
them, and the broken copies a user may have."""

import re
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from cudt.data import DataError, load_video_data, load_videos, make_sequences
from cudt.data.video import archives

W, H = 48, 40  # native frame size of the tiny videos
TOL = 10 / 255  # mean absolute error allowed after codec / JPEG round trips


def square_frames(n: int, base: int, rgb: bool = False) -> list[np.ndarray]:
    """``n`` uint8 frames: a flat background ``base`` and a bright square moving right."""
    frames = []
    for i in range(n):
        a = np.full((H, W, 3) if rgb else (H, W), base, np.uint8)
        a[8:24, 2 + 4 * i : 18 + 4 * i] = (230, 120, 60) if rgb else 230
        frames.append(a)
    return frames


def write_avi(path: Path, frames: list[np.ndarray], codec: str = "mpeg4") -> None:
    archives.write_avi(path, frames, codec=codec, bit_rate=2_000_000)


def write_jpegs(folder: Path, frames: list[np.ndarray], names=None) -> None:
    assert not folder.exists()
    archives.write_frames(folder, frames, suffix=".jpg", names=names, quality=95)


def expected(frames: list[np.ndarray], size: int) -> np.ndarray:
    """The preprocessing of the readers on the frames as written: L, bilinear resize, /255."""
    out = []
    for a in frames:
        im = Image.fromarray(a).convert("L").resize((size, size), Image.Resampling.BILINEAR)
        out.append(np.asarray(im, np.float32) / 255)
    return np.stack(out)


def assert_frames_match(got: np.ndarray, frames: list[np.ndarray]) -> None:
    want = expected(frames, got.shape[-1])
    assert got.shape == want.shape and got.dtype == np.float32
    err = np.abs(got[:, None] - want[None]).mean(axis=(2, 3))  # [F_got, F_want]
    assert err.diagonal().max() < TOL, err.diagonal()
    # Frame order: each decoded frame is closest to the frame written at its position.
    np.testing.assert_array_equal(err.argmin(axis=1), np.arange(len(want)))


# Videos of the tiny datasets: name -> (frame count, background, rgb, codec).
AVENUE_TRAIN = {
    "01": (6, 40, False, "mpeg4"),
    "02": (7, 70, True, "mjpeg"),
    "03": (6, 100, False, "mpeg4"),
}
AVENUE_TEST = {"01": (5, 130, False, "mpeg4"), "02": (8, 160, True, "mpeg4")}
SHANGHAI_TRAIN = {
    "01_001": (6, 30, False, "mpeg4"),
    "01_002": (5, 60, True, "mjpeg"),
    "02_001": (7, 90, False, "mpeg4"),
}
SHANGHAI_TEST = {"01_0014": (6, 120), "01_0015": (12, 150)}  # JPEG frame folders


def frames_of(spec) -> list[np.ndarray]:
    n, base, *rest = spec
    return square_frames(n, base, rgb=bool(rest and rest[0]))


def build_avenue(root: Path) -> Path:
    top = root / "Avenue Dataset"
    for split, videos in (("training_videos", AVENUE_TRAIN), ("testing_videos", AVENUE_TEST)):
        for name, spec in videos.items():
            write_avi(top / split / f"{name}.avi", frames_of(spec), codec=spec[3])
    # Ground truth beside the videos, and the litter of copies from other systems.
    for folder, file in (
        ("training_vol", "vol01.mat"),
        ("testing_vol", "vol01.mat"),
        ("testing_label_mask", "1_label.mat"),
        ("ground_truth_demo/testing_label_mask", "1_label.mat"),
    ):
        (top / folder).mkdir(parents=True, exist_ok=True)
        (top / folder / file).write_bytes(b"MATLAB 5.0 MAT-file")
    (top / "training_videos" / "._01.avi").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    (top / "training_videos" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (top / "testing_videos" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    (top / "._testing_videos").write_bytes(b"\x00\x05\x16\x07")
    return top


def build_shanghaitech(root: Path) -> Path:
    top = root / "shanghaitech"
    for name, spec in SHANGHAI_TRAIN.items():
        write_avi(top / "training" / "videos" / f"{name}.avi", frames_of(spec), codec=spec[3])
    for name, spec in SHANGHAI_TEST.items():
        frames = frames_of(spec)
        # 01_0015 has unpadded names: numeric order puts 2.jpg before 10.jpg.
        names = [str(i) for i in range(len(frames))] if name == "01_0015" else None
        write_jpegs(top / "testing" / "frames" / name, frames, names)
        for mask in ("test_frame_mask", "test_pixel_mask"):
            (top / "testing" / mask).mkdir(parents=True, exist_ok=True)
            np.save(top / "testing" / mask / f"{name}.npy", np.zeros(len(frames), np.int64))
    (top / "training" / "videos" / "._01_001.avi").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    (top / "training" / "videos" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    clip = top / "testing" / "frames" / "01_0014"
    (clip / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    (clip / "._000.jpg").write_bytes(b"\x00\x05\x16\x07")
    return top


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """Both datasets, built once; tests that break them work on copies (:func:`copy_of`)."""
    root = tmp_path_factory.mktemp("datasets")
    return {"avenue": build_avenue(root / "a"), "shanghaitech": build_shanghaitech(root / "s")}


def copy_of(datasets, name: str, tmp_path: Path) -> Path:
    top = datasets[name]
    return Path(shutil.copytree(top, tmp_path / top.name))


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------------------------------
# Layouts, pixels, order
# --------------------------------------------------------------------------------------------------


def test_avenue_layout(datasets):
    top = datasets["avenue"]
    for root in (top, top.parent):  # 'Avenue Dataset' itself, or the folder holding it
        data = load_videos(root, dataset="avenue", size=32)
        assert set(data) == {"train", "test"}
        assert [len(v) for v in data["train"]] == [6, 7, 6]  # ._01.avi and .DS_Store skipped
        assert [len(v) for v in data["test"]] == [5, 8]  # Thumbs.db skipped
        for got, spec in zip(
            data["train"] + data["test"],
            [*AVENUE_TRAIN.values(), *AVENUE_TEST.values()],
            strict=True,
        ):
            assert_frames_match(got, frames_of(spec))
    # The paper's preprocessing size by default.
    assert load_videos(top, dataset="avenue", max_videos=1)["train"][0].shape == (6, 160, 160)


def test_shanghaitech_layout(datasets):
    top = datasets["shanghaitech"]
    for root in (top, top.parent):
        data = load_videos(root, dataset="shanghaitech", size=32)
        assert [len(v) for v in data["train"]] == [6, 5, 7]
        assert [len(v) for v in data["test"]] == [6, 12]  # Thumbs.db and ._000.jpg skipped
        for got, spec in zip(
            data["train"] + data["test"],
            [*SHANGHAI_TRAIN.values(), *SHANGHAI_TEST.values()],
            strict=True,
        ):
            assert_frames_match(got, frames_of(spec))  # 01_0015: 0, 1, 2, ..., 10, 11


def test_caps_on_videos_and_frames(datasets):
    for name in ("avenue", "shanghaitech"):
        data = load_videos(datasets[name], dataset=name, size=16, max_videos=2, max_frames=4)
        assert [v.shape for v in data["train"]] == [(4, 16, 16)] * 2
        assert [v.shape for v in data["test"]] == [(4, 16, 16)] * 2
        full = load_videos(datasets[name], dataset=name, size=16)
        np.testing.assert_array_equal(data["train"][1], full["train"][1][:4])  # the first frames
        np.testing.assert_array_equal(data["test"][1], full["test"][1][:4])


@pytest.mark.parametrize("name", ["avenue", "shanghaitech", "ucsd"])
def test_videos_that_would_not_fit_in_memory_are_refused_before_decoding(
    datasets, tmp_path, monkeypatch, name
):
    """The frames are counted before any is decoded (the .avi headers, the frame folders'
    files); videos that would not fit in the memory available now, as frames and their
    sequences, are refused in one line naming the sizes and the --max-videos that fits, and
    that --max-videos then reads. (Full ShanghaiTech at 160x160 would need about 91 GiB.)"""
    from cudt.data.video import frames
    from cudt.data.video.avi import listed_frames

    if name == "ucsd":
        videos = [np.full((n, 8, 8), 0.5, np.float32) for n in (6, 5, 7, 6, 8)]
        top = archives.write_ucsd(tmp_path, {"train": videos[:3], "test": videos[3:]})
    else:
        top = datasets[name]
    full = load_videos(top, dataset=name, size=32)
    lengths = [len(v) for split in full.values() for v in split]
    if name == "avenue":
        files = sorted((top / "training_videos").glob("[0-9]*.avi"))
        files += sorted((top / "testing_videos").glob("[0-9]*.avi"))
        assert [listed_frames(p) for p in files] == lengths  # the headers count what decodes
    need = sum(lengths) * 32 * 32 * 12  # float32 frames, their sequences, sigma_x float64
    monkeypatch.setattr(frames, "available_memory", lambda: need - 1)
    decoded = []
    monkeypatch.setattr(frames, "_read_video", lambda *a: decoded.append(a))
    monkeypatch.setattr("cudt.data.video.avi.read_avi", lambda *a, **k: decoded.append(a))
    with pytest.raises(DataError) as excinfo:
        load_videos(top, dataset=name, size=32)
    message = one_line(excinfo)
    assert f"{len(lengths)} videos of {sum(lengths)} frames need about {need / 1024:.0f} KiB" in (
        message
    ), message
    assert message.endswith("(videos per split) or run where more memory is free")
    assert not decoded  # refused before a frame was read
    fit = int(re.search(r"--max-videos (\d+)", message).group(1))
    monkeypatch.undo()
    monkeypatch.setattr(frames, "available_memory", lambda: need - 1)
    capped = load_videos(top, dataset=name, size=32, max_videos=fit)
    assert 0 < sum(len(v) for split in capped.values() for v in split) < sum(lengths)
    monkeypatch.setattr(frames, "available_memory", lambda: None)  # unknown: not checked
    assert [len(v) for v in load_videos(top, dataset=name, size=32)["train"]] == [
        len(v) for v in full["train"]
    ]


@pytest.mark.parametrize("name", ["avenue", "shanghaitech"])
def test_val_comes_from_the_training_videos(datasets, name):
    videos = load_videos(datasets[name], dataset=name, size=32)
    data = load_video_data(name, datasets[name], seq_len=2, size=32)
    # 3 training videos: the first 2 train, the last one (by name) val; test = the test videos.
    # ShanghaiTech's are scenes 01, 01, 02: scene 01's last clip is val, 02's one clip trains.
    train, val, test = videos["train"][:2], videos["train"][2:], videos["test"]
    if name == "shanghaitech":
        train, val = [videos["train"][0], videos["train"][2]], [videos["train"][1]]
    for got, want in ((data.train, train), (data.val, val), (data.test, test)):
        np.testing.assert_array_equal(got, make_sequences(want, 2))
    assert data.source == f"{name}:{datasets[name]}"
    assert data.sigma == pytest.approx(float(np.std(data.train)), rel=1e-6)


def test_a_single_training_video_is_split_in_time(datasets, tmp_path):
    top = tmp_path / "Avenue Dataset"
    write_avi(top / "training_videos" / "01.avi", square_frames(8, 50))
    write_avi(top / "testing_videos" / "01.avi", square_frames(5, 90))
    video = load_videos(top, dataset="avenue", size=32)["train"][0]
    data = load_video_data("avenue", top, seq_len=2, size=32)
    # 8 frames: val = the last max(round(0.15 * 8), seq_len) = 2 frames, train = the first 6.
    np.testing.assert_array_equal(data.train, make_sequences([video[:6]], 2))
    np.testing.assert_array_equal(data.val, make_sequences([video[6:]], 2))
    assert data.test.shape == (2 * 4, 2, 256)
    with pytest.raises(DataError) as e:
        load_video_data("avenue", top, seq_len=5, size=32)
    assert "only training video has 8 frames, too few to split in time" in one_line(e)
    assert "add training videos or pass a smaller seq_len" in one_line(e)
    # max_videos=1 leaves one training video: the same split in time (01.avi: 6 frames, 4 + 2).
    data = load_video_data("avenue", datasets["avenue"], seq_len=2, size=32, max_videos=1)
    assert (len(data.train), len(data.val), len(data.test)) == (2 * 4, 4, 2 * 4)


# --------------------------------------------------------------------------------------------------
# Broken copies: one DataError line naming the problem and the fix
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["avenue", "shanghaitech"])
def test_missing_folder(tmp_path, name):
    with pytest.raises(DataError) as e:
        load_video_data(name, tmp_path / "nope")
    assert "does not exist" in one_line(e) and "pass --data-dir pointing at" in one_line(e)
    assert ("training_videos" if name == "avenue" else "training/videos") in one_line(e)


def test_no_training_folder(datasets, tmp_path):
    (tmp_path / "empty" / "stuff").mkdir(parents=True)
    with pytest.raises(DataError) as e:
        load_videos(tmp_path / "empty", dataset="avenue")
    assert "no training_videos/ folder under" in one_line(e)
    assert "expected the avenue layout root/training_videos/01.avi" in one_line(e)
    with pytest.raises(DataError) as e:
        load_videos(tmp_path / "empty", dataset="shanghaitech")
    assert "no training/videos/ folder under" in one_line(e)
    assert "testing/frames/01_0014/000.jpg" in one_line(e)
    # The other dataset's folder: a wrong dataset name, said so.
    with pytest.raises(DataError) as e:
        load_videos(datasets["shanghaitech"].parent, dataset="avenue")
    assert "looks like the shanghaitech layout: pass --dataset shanghaitech" in one_line(e)
    with pytest.raises(DataError) as e:
        load_videos(datasets["avenue"], dataset="shanghaitech")
    assert "looks like the avenue layout" in one_line(e)


def test_no_test_folder(datasets, tmp_path):
    top = copy_of(datasets, "avenue", tmp_path / "a")
    shutil.rmtree(top / "testing_videos")
    with pytest.raises(DataError) as e:
        load_videos(top, dataset="avenue")
    assert "no testing_videos/ folder beside" in one_line(e) and "extract the test" in one_line(e)
    top = copy_of(datasets, "shanghaitech", tmp_path / "s")
    shutil.rmtree(top / "testing" / "frames")
    with pytest.raises(DataError, match=r"no testing/frames/ folder in .*extract the test clips"):
        load_videos(top, dataset="shanghaitech")


@pytest.mark.parametrize("name", ["avenue", "shanghaitech"])
def test_undecodable_avi(datasets, tmp_path, name):
    top = copy_of(datasets, name, tmp_path)
    folder = top / ("training_videos" if name == "avenue" else "training/videos")
    video = sorted(folder.glob("0*.avi"))[{"avenue": 1, "shanghaitech": 2}[name]]  # mjpeg, mpeg4
    data = video.read_bytes()
    fix = "re-download or re-extract that video, or delete the file"
    invalid, truncated = "Invalid data found", "truncated or corrupt"
    cases = {
        "text": (b"<html>404 Not Found</html>\n" * 20, invalid),
        "empty": (b"", invalid),
        "truncated header": (data[:300], invalid),
        # A copy interrupted half-way: the header may or may not be readable.
        "truncated": (data[: len(data) * 3 // 5], f"({invalid}|{truncated})"),
        # Only the last frame cut short (the index after it gone).
        "last frame cut": (data[: data.rfind(b"idx1") - 8], truncated),
    }
    for case, (content, reason) in cases.items():
        video.write_bytes(content)
        with pytest.raises(DataError) as e:
            load_videos(top, dataset=name, size=16)
        message = one_line(e)
        assert f"cannot decode video '{video}'" in message, case
        assert re.search(reason, message) and fix in message, (case, message)
    # Losing only the index at the end leaves every frame: still read.
    video.write_bytes(data[: data.rfind(b"idx1") + 20])
    assert len(load_videos(top, dataset=name, size=16)["train"]) == 3
    Image.new("RGB", (W, H)).save(video, format="PNG")  # an image renamed .avi
    with pytest.raises(DataError, match=r"cannot decode video .* \(it is an image"):
        load_videos(top, dataset=name, size=16)


def test_test_clip_without_frames(datasets, tmp_path):
    top = copy_of(datasets, "shanghaitech", tmp_path)
    clip = top / "testing" / "frames" / "01_0016"
    clip.mkdir()
    (clip / ".DS_Store").write_bytes(b"x")
    with pytest.raises(DataError) as e:
        load_video_data("shanghaitech", top, seq_len=2, size=16)
    assert "01_0016' has no image frames" in one_line(e)
    shutil.rmtree(top / "testing" / "frames")
    (top / "testing" / "frames").mkdir()
    with pytest.raises(DataError, match="no test clip folders in"):
        load_video_data("shanghaitech", top, seq_len=2, size=16)


def test_frames_of_mixed_sizes(datasets, tmp_path):
    top = copy_of(datasets, "shanghaitech", tmp_path)
    Image.new("L", (W + 8, H), 0).save(top / "testing" / "frames" / "01_0014" / "006.jpg")
    with pytest.raises(DataError) as e:
        load_video_data("shanghaitech", top, seq_len=2, size=16)
    assert "01_0014' differ in size: 000.jpg is 48x40 but 006.jpg is 56x40" in one_line(e)
    assert "re-extract the video so all its frames have one size" in one_line(e)


def test_avi_frames_of_mixed_sizes(datasets, tmp_path):
    # An MJPEG stream whose last packet is a JPEG of another size (a botched concatenation).
    top = copy_of(datasets, "avenue", tmp_path)
    path = top / "testing_videos" / "02.avi"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mjpeg", rate=25)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuvj420p"
        for a in square_frames(3, 100):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(a, format="gray")))
        wider = av.CodecContext.create("mjpeg", "w")
        wider.width, wider.height, wider.pix_fmt = W + 8, H, "yuvj420p"
        wider.time_base = Fraction(1, 25)
        frame = av.VideoFrame.from_ndarray(np.zeros((H, W + 8), np.uint8), format="gray")
        frame = frame.reformat(format="yuvj420p")
        frame.pts = 3
        for packet in wider.encode(frame):
            packet.stream, packet.pts, packet.dts = stream, 3, 3
            out.mux(packet)
        out.mux(stream.encode())
    with pytest.raises(DataError) as e:
        load_videos(top, dataset="avenue", size=16)
    assert f"frames in video '{path}' differ in size: frame 0 is 48x40 but frame 3 is 56x40" in (
        one_line(e)
    )
    assert "re-encode the video so all its frames have one size" in one_line(e)


def test_no_videos_left_after_skipping_hidden_files(datasets, tmp_path):
    top = copy_of(datasets, "avenue", tmp_path / "a")
    for avi in (top / "training_videos").glob("0*.avi"):
        avi.unlink()
    (top / "training_videos" / "readme.txt").write_text("videos go here")
    with pytest.raises(DataError) as e:
        load_video_data("avenue", top)
    assert "no .avi videos in" in one_line(e) and "training_videos" in one_line(e)
    assert "(hidden files skipped), only .txt files" in one_line(e)
    top = copy_of(datasets, "shanghaitech", tmp_path / "s")
    for avi in (top / "training" / "videos").glob("0*.avi"):
        avi.unlink()
    with pytest.raises(DataError, match=r"no \.avi videos in .*videos' \(hidden files skipped\):"):
        load_video_data("shanghaitech", top)


def test_too_few_frames_for_a_sequence(datasets):
    with pytest.raises(DataError) as e:
        load_video_data("avenue", datasets["avenue"], seq_len=7, size=16)
    assert "01.avi' has 6 frames, too few frames for one sequence of seq_len=7" in one_line(e)
    with pytest.raises(DataError, match=r"has 3 frames \(max_frames=3\), too few"):
        load_video_data("shanghaitech", datasets["shanghaitech"], seq_len=4, max_frames=3)


def test_shanghaitech_validation_comes_from_every_scene_it_can(datasets):
    """ShanghaiTech's clips are ``<scene>_<clip>`` from 13 cameras: validation is carved scene by
    scene, so every scene is trained on (split as one list, its last ~15 % was the last
    cameras' clips, which then went untrained). Here scene 01's two clips give 01_002 to
    validation; scene 02's one clip stays in training."""
    from cudt.data.video.frames import training_scenes

    top = datasets["shanghaitech"]
    assert training_scenes(top, "shanghaitech") == ["01", "01", "02"]
    assert training_scenes(top, "shanghaitech", max_videos=2) == ["01", "01"]
    assert training_scenes(top, "avenue") is None
    videos = load_videos(top, dataset="shanghaitech", size=32)["train"]
    data = load_video_data("shanghaitech", top, seq_len=2, size=32, keep_frames=True)
    np.testing.assert_array_equal(data.frames["val"], videos[1])
    np.testing.assert_array_equal(data.frames["train"], np.concatenate([videos[0], videos[2]]))


def test_split_by_scene_keeps_single_clip_scenes_for_training():
    from cudt.data.video.splits import split_by_scene, split_train_val

    videos = [np.full((8, 2, 2), i, np.float32) for i in range(7)]
    ids = lambda vs: [int(v[0, 0, 0]) for v in vs]  # noqa: E731
    train, val = split_by_scene(videos, ["a", "a", "a", "b", "b", "c", "b"], seq_len=2)
    assert (ids(train), ids(val)) == ([0, 1, 3, 4, 5], [2, 6])  # the last clip of a, of b
    for scenes in (None, ["a"] * 7, list("abcdefg")):  # one scene, or none of two clips
        got = split_by_scene(videos, scenes, seq_len=2)
        assert [ids(x) for x in got] == [ids(x) for x in split_train_val(videos, 2)]


@pytest.mark.parametrize("name", ["avenue", "shanghaitech"])
@pytest.mark.parametrize("wrong", ["ucsd", "frames"])
def test_a_video_archive_read_as_frame_folders_names_its_dataset(datasets, name, wrong):
    """--dataset ucsd or frames on Avenue's or ShanghaiTech's archive (its .avi videos): one
    line naming the dataset to pass, where it said the videos had no image frames."""
    for root in (datasets[name], datasets[name].parent):
        with pytest.raises(DataError) as err:
            load_video_data(wrong, root, seq_len=2, size=32)
        line = one_line(err)
        assert "archive's videos" in line and line.endswith(f"pass --dataset {name}"), line


def test_frame_folders_beside_a_video_archive_are_read(datasets, tmp_path):
    """A folder of datasets: UCSD frame folders beside the Avenue archive. --dataset ucsd reads
    UCSDped2 there, and one level too high names the UCSD folder, where both said "pass
    --dataset avenue"."""
    shutil.copytree(datasets["avenue"], tmp_path / "Avenue Dataset")
    frames = {"train": [np.full((3, 8, 8), 60, np.uint8)] * 2, "test": [np.zeros((3, 8, 8))]}
    ucsd = archives.write_ucsd(tmp_path, frames)
    with pytest.raises(DataError) as err:
        load_video_data("ucsd", tmp_path, seq_len=2, size=16)
    assert f"'{ucsd}' holds it: pass --data-dir '{ucsd}'" in one_line(err)
    shutil.move(ucsd / "UCSDped2", tmp_path / "UCSDped2")
    data = load_video_data("ucsd", tmp_path, seq_len=2, size=16)
    assert (len(data.train), len(data.val), len(data.test)) == (1, 1, 1)  # a sequence a video
    np.testing.assert_allclose(data.train, 60 / 255, atol=1e-6)


@pytest.mark.parametrize("name", ["avenue", "shanghaitech"])
def test_a_video_dataset_given_as_frame_folders_names_the_dataset_that_reads_them(tmp_path, name):
    """Avenue or ShanghaiTech with their frames extracted (``training/frames/01/0000.jpg``, as
    the usual preprocessed copies ship): --dataset avenue or shanghaitech named only the
    missing .avi folder and said to point --data-dir at the extracted dataset, which it was;
    it names --dataset frames, which reads that folder (UCSD's Train/: --dataset ucsd)."""
    frames = np.zeros((3, 16, 16), np.uint8)
    for split, clips in (("training", ("01", "02")), ("testing", ("01",))):
        for clip in clips:
            archives.write_frames(tmp_path / name / split / "frames" / clip, frames)
    for root in (tmp_path / name, tmp_path):
        with pytest.raises(DataError) as err:
            load_videos(root, dataset=name)
        assert "(it holds the videos as folders of frames: pass --dataset frames)" in one_line(err)
    data = load_video_data("frames", tmp_path / name, seq_len=2, size=16)
    assert (len(data.train), len(data.val), len(data.test)) == (1, 1, 1)
    ucsd = archives.write_ucsd(tmp_path / "u", {"train": [frames] * 2, "test": [frames]})
    with pytest.raises(DataError) as err:
        load_videos(ucsd / "UCSDped2", dataset=name)
    assert "pass --dataset ucsd)" in one_line(err)
