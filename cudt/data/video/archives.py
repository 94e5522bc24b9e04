"""Writers of video datasets in the layouts their archives extract to (UCSD, Avenue, ShanghaiTech).

They build small copies of the real datasets for tests and for ``experiments.video_table --scale
tiny``: the same folder names, file formats and naming schemes, with the ground truth and the
litter of other systems beside the videos, so the real readers (:func:`cudt.data.load_videos`)
are exercised on what a user's extracted archive holds.

Every writer takes ``root`` (the folder that will hold the dataset folder) and ``videos``, a
mapping ``{"train": [video, ...], "test": [video, ...]}`` of ``[F, H, W]`` grayscale frames
(float in ``[0, 1]`` or uint8), and returns the dataset folder. A split given as
:class:`LazyVideos` is made one video at a time as it is written (a generator's videos, which
together may not fit in memory); the others are all checked before anything is written:

* :func:`write_ucsd`: ``UCSD_Anomaly_Dataset.v1p2/UCSDped2/Train/Train001/001.tif`` (8-bit TIFF
  frames), ``Test/Test001/001.tif``, the pixel masks ``Test/Test001_gt/001.bmp`` beside the
  first test clip, the MATLAB ground-truth file ``Test/UCSDped2.m``;
* :func:`write_avenue`: ``Avenue Dataset/training_videos/01.avi`` and
  ``testing_videos/01.avi`` (MPEG-4 Part 2 in AVI, written with PyAV), ``training_vol/``,
  ``testing_vol/``, ``testing_label_mask/`` and ``ground_truth_demo/`` beside them (their
  ``.mat`` files are placeholders, a MAT header line only: the readers skip them, and
  ``scipy.io.loadmat`` cannot read them);
* :func:`write_shanghaitech`: ``shanghaitech/training/videos/01_001.avi`` (AVI) and
  ``testing/frames/01_0014/000.jpg`` (JPEG frame folders), with the masks
  ``testing/test_frame_mask/01_0014.npy`` and ``testing/test_pixel_mask/01_0014.npy``.

macOS/Windows litter (``.DS_Store``, AppleDouble ``._*`` files, ``Thumbs.db``) is added where a
copied archive has it (``litter=False`` leaves it out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from cudt.errors import DataError

__all__ = [
    "AVENUE",
    "SHANGHAITECH",
    "UCSD",
    "LazyVideos",
    "to_uint8",
    "write_avenue",
    "write_avi",
    "write_frames",
    "write_shanghaitech",
    "write_ucsd",
]

# The dataset folders as their archives extract.
UCSD = "UCSD_Anomaly_Dataset.v1p2"
AVENUE = "Avenue Dataset"
SHANGHAITECH = "shanghaitech"

_DS_STORE = b"\x00\x00\x00\x01Bud1"
_APPLE_DOUBLE = b"\x00\x05\x16\x07AppleDouble"
_THUMBS_DB = b"\xd0\xcf\x11\xe0"


def to_uint8(frames) -> np.ndarray:
    """8-bit frames: uint8 as is, floats in [0, 1] scaled by 255 and rounded (clipped)."""
    a = np.asarray(frames)
    if a.dtype == np.uint8:
        return a
    if not np.issubdtype(a.dtype, np.floating):
        raise DataError(f"frames must be uint8 or floats in [0, 1], got {a.dtype}: convert them")
    return np.clip(np.rint(a.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)


class LazyVideos(Sequence):
    """A split of ``count`` videos made as the writers reach them: ``make(i)`` returns video
    ``i`` (``[F, H, W]``, as any entry of ``videos``). Nothing is kept: each access makes the
    video again, so a writer holds one video at a time, not the split."""

    def __init__(self, count: int, make: Callable[[int], np.ndarray]):
        self._indices = range(count)
        self._make = make

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, i):
        index = self._indices[i]  # an IndexError past the end ends an iteration
        if isinstance(index, range):
            return LazyVideos(len(index), lambda k: self._make(index[k]))
        return self._make(index)


def _video8(video, split: str, i: int) -> np.ndarray:
    a = to_uint8(video)
    if a.ndim != 3 or (a.ndim == 3 and 0 in a.shape):
        raise DataError(f"{split} video {i} has shape {a.shape}: pass [F, H, W] frames")
    return a


def _videos(videos: Mapping[str, Sequence], split: str) -> Sequence[np.ndarray]:
    found = videos.get(split, ())
    if isinstance(found, LazyVideos):  # each made, converted and checked as it is written
        out = LazyVideos(len(found), lambda i: _video8(found[i], split, i))
    else:
        out = [_video8(v, split, i) for i, v in enumerate(found)]
    if not len(out):
        raise DataError(f"no {split} videos to write: pass videos={{'{split}': [[F, H, W], ...]}}")
    return out


def write_avi(
    path: str | Path,
    frames,
    *,
    codec: str = "mpeg4",
    rate: int = 25,
    bit_rate: int = 4_000_000,
) -> Path:
    """One ``.avi`` with PyAV: grayscale ``[F, H, W]`` (or RGB ``[F, H, W, 3]``) uint8/float
    frames; ``codec`` mpeg4 (yuv420p) or mjpeg (yuvj420p). The size is the frames' own (even
    sizes round-trip exactly; yuv420p needs them)."""
    import av  # PyAV only for the datasets stored as videos

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = [to_uint8(a) for a in frames]
    if not frames:
        raise DataError(f"no frames to write to {path}: pass at least one frame")
    h, w = frames[0].shape[:2]
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        stream.bit_rate = bit_rate
        for a in frames:
            fmt = "rgb24" if a.ndim == 3 else "gray"
            out.mux(stream.encode(av.VideoFrame.from_ndarray(a, format=fmt)))
        out.mux(stream.encode())
    return path


def write_frames(
    folder: str | Path,
    frames,
    *,
    suffix: str = ".jpg",
    names: Sequence[str] | None = None,
    quality: int = 95,
) -> Path:
    """A folder of image frames ``000.jpg, 001.jpg, ...`` (or ``names``); creates ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    frames = [to_uint8(a) for a in frames]
    names = list(names) if names is not None else [f"{i:03d}" for i in range(len(frames))]
    if len(names) != len(frames):
        raise DataError(f"{len(names)} names for {len(frames)} frames: pass one name per frame")
    for name, a in zip(names, frames, strict=True):
        kw = {"quality": quality} if suffix.lower() in (".jpg", ".jpeg") else {}
        Image.fromarray(a).save(folder / f"{name}{suffix}", **kw)
    return folder


def write_ucsd(
    root: str | Path, videos: Mapping[str, Sequence], *, subset: str = "UCSDped2", litter=True
) -> Path:
    """``root/UCSD_Anomaly_Dataset.v1p2/<subset>/{Train,Test}/...`` (see the module docstring);
    returns the ``UCSD_Anomaly_Dataset.v1p2`` folder (a ``data_dir`` for ``--dataset ucsd``)."""
    top = Path(root) / UCSD
    ped = top / subset
    train, test = _videos(videos, "train"), _videos(videos, "test")
    for split, split_videos, prefix in (("Train", train, "Train"), ("Test", test, "Test")):
        for i, video in enumerate(split_videos, start=1):
            names = [f"{k:03d}" for k in range(1, len(video) + 1)]  # 001.tif: UCSD counts from 1
            write_frames(ped / split / f"{prefix}{i:03d}", video, suffix=".tif", names=names)
    # Ground truth: pixel masks of the first test clip beside it (not a video), and the
    # frame-level annotations as a MATLAB script.
    first = test[0]
    masks = np.zeros_like(first)
    masks[:, : first.shape[1] // 4, : first.shape[2] // 4] = 255
    names = [f"{k:03d}" for k in range(1, len(first) + 1)]
    write_frames(ped / "Test" / "Test001_gt", masks, suffix=".bmp", names=names)
    (ped / "Test" / f"{subset}.m").write_text(
        "TestVideoFile = {};\n"
        + "".join(
            f"TestVideoFile{{end+1}}.gt_frame = [1:{len(v)}];\n" for v in test
        )  # every frame "anomalous": the readers never look at it
    )
    (top / "README.txt").write_text("UCSD Anomaly Detection Dataset (tiny copy written by cudt)\n")
    if litter:
        (ped / "Train" / ".DS_Store").write_bytes(_DS_STORE)
        (ped / "Test" / "Test001" / "._001.tif").write_bytes(_APPLE_DOUBLE)
        (ped / "Test" / "Test001" / "Thumbs.db").write_bytes(_THUMBS_DB)
    return top


def write_avenue(
    root: str | Path, videos: Mapping[str, Sequence], *, litter=True, rate: int = 25
) -> Path:
    """``root/Avenue Dataset/{training_videos,testing_videos}/01.avi`` (``rate`` frames per
    second) and the ground-truth folders beside them, with placeholder ``.mat`` files (the module
    docstring); returns the ``Avenue Dataset`` folder."""
    top = Path(root) / AVENUE
    train, test = _videos(videos, "train"), _videos(videos, "test")
    for split, split_videos in (("training_videos", train), ("testing_videos", test)):
        for i, video in enumerate(split_videos, start=1):
            write_avi(top / split / f"{i:02d}.avi", video, rate=rate)
    # Ground truth as the archive ships it (MATLAB files the readers must skip).
    for folder, files in (
        ("training_vol", [f"vol{i:02d}.mat" for i in range(1, len(train) + 1)]),
        ("testing_vol", [f"vol{i:02d}.mat" for i in range(1, len(test) + 1)]),
        ("testing_label_mask", [f"{i}_label.mat" for i in range(1, len(test) + 1)]),
        ("ground_truth_demo/testing_label_mask", ["1_label.mat"]),
    ):
        (top / folder).mkdir(parents=True, exist_ok=True)
        for name in files:
            (top / folder / name).write_bytes(b"MATLAB 5.0 MAT-file, written by cudt")
    if litter:
        (top / "training_videos" / "._01.avi").write_bytes(_APPLE_DOUBLE)
        (top / "training_videos" / ".DS_Store").write_bytes(_DS_STORE)
        (top / "testing_videos" / "Thumbs.db").write_bytes(_THUMBS_DB)
        (top / "._testing_videos").write_bytes(_APPLE_DOUBLE)
    return top


def write_shanghaitech(
    root: str | Path,
    videos: Mapping[str, Sequence],
    *,
    litter=True,
    rate: int = 25,
    clips_per_scene: int = 2,
) -> Path:
    """``root/shanghaitech/training/videos/01_001.avi`` (``rate`` frames per second) and
    ``testing/frames/01_0014/000.jpg`` with the frame and pixel masks beside them; returns the
    ``shanghaitech`` folder.

    Training videos are named ``<scene>_<clip>`` with scenes 01, 02, ... taking
    ``clips_per_scene`` clips each (the reader draws validation clips from each scene: pass 1
    for videos that share no scene); test clips ``01_0014, 01_0015, ...`` (the scene-01 test
    clips of the real dataset)."""
    if clips_per_scene < 1:
        raise DataError(f"clips_per_scene must be >= 1, got {clips_per_scene}: pass 1 or more")
    top = Path(root) / SHANGHAITECH
    train, test = _videos(videos, "train"), _videos(videos, "test")
    for i, video in enumerate(train):
        scene, clip = divmod(i, clips_per_scene)
        name = f"{scene + 1:02d}_{clip + 1:03d}.avi"
        write_avi(top / "training" / "videos" / name, video, rate=rate)
    for i, video in enumerate(test):
        name = f"01_{14 + i:04d}"
        write_frames(top / "testing" / "frames" / name, video, suffix=".jpg")
        for mask in ("test_frame_mask", "test_pixel_mask"):
            (top / "testing" / mask).mkdir(parents=True, exist_ok=True)
            shape = (len(video),) if mask == "test_frame_mask" else video.shape
            np.save(top / "testing" / mask / f"{name}.npy", np.zeros(shape, np.uint8))
    if litter:
        (top / "training" / "videos" / "._01_001.avi").write_bytes(_APPLE_DOUBLE)
        (top / "training" / "videos" / ".DS_Store").write_bytes(_DS_STORE)
        clip = top / "testing" / "frames" / "01_0014"
        (clip / "Thumbs.db").write_bytes(_THUMBS_DB)
        (clip / "._000.jpg").write_bytes(_APPLE_DOUBLE)
    return top
