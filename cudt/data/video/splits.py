"""Videos to model inputs: split by video, patch-token sequences, the dataset entry point, noise.

A model *sequence* is one patch location followed over ``T`` consecutive frames: ``[T, p*p]``.
:func:`load_video_data` reads or generates the videos, splits them (:func:`split_videos`,
:func:`split_train_val`) and cuts each split into sequences (:func:`make_sequences`);
:func:`perturb` adds the noise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cudt.data.video.frames import (
    _EXPECTED_LAYOUT,
    DATASETS,
    load_videos,
    training_scenes,
    ucsd_subsets,
)
from cudt.data.video.synthetic import synthetic_videos
from cudt.errors import DataError

__all__ = [
    "VAL_FRACTION",
    "VideoSplits",
    "load_video_data",
    "make_sequences",
    "patchify",
    "perturb",
    "split_by_scene",
    "split_train_val",
    "split_videos",
    "unpatchify",
]

# Fraction of the training videos (or, with one training video, of its frames) held out as val.
VAL_FRACTION = 0.15


# --------------------------------------------------------------------------------------------------
# Splits, patches, sequences
# --------------------------------------------------------------------------------------------------


def split_videos(
    videos: Sequence[np.ndarray] | np.ndarray,
    fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
) -> tuple:
    """Split by video into ``(train, val, test)``: consecutive runs, in the given order.

    Counts follow ``fractions`` (largest remainder), with at least one video per split. A video is
    never in two splits. Lists give lists, an array ``[V, ...]`` gives arrays.
    """
    n = len(videos)
    if n < 3:
        raise DataError(
            f"need at least 3 videos to split into train/val/test by video, got {n}: "
            "generate or provide more videos"
        )
    frac = np.asarray(fractions, dtype=np.float64)
    if frac.shape != (3,) or not np.all(frac > 0):
        raise DataError(
            f"fractions must be three positive numbers (train, val, test), got {fractions!r}"
        )
    exact = frac / frac.sum() * n
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    for i in range(3):  # every split gets a video, taken from the largest one
        if counts[i] == 0:
            counts[int(np.argmax(counts))] -= 1
            counts[i] = 1
    a, b = int(counts[0]), int(counts[0] + counts[1])
    if isinstance(videos, np.ndarray):
        return videos[:a], videos[a:b], videos[b:]
    videos = list(videos)
    return videos[:a], videos[a:b], videos[b:]


def split_train_val(
    videos: Sequence[np.ndarray], seq_len: int, fraction: float = VAL_FRACTION
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hold out validation footage from the training videos: ``(train, val)``.

    With ``V >= 2`` videos, *val* is the last ``round(fraction * V)`` videos (at least one, at most
    ``V - 1``), *train* the others: split by video, in the given (sorted name) order. With a single
    video of ``F`` frames it is split in time instead: *val* is its last ``max(round(fraction * F),
    seq_len)`` frames, *train* the frames before, which must hold ``seq_len`` frames too.
    """
    videos = list(videos)
    n = len(videos)
    if n == 0:
        raise DataError("split_train_val got no videos: pass at least one training video")
    if n >= 2:
        n_val = min(max(1, math.floor(fraction * n + 0.5)), n - 1)
        return videos[: n - n_val], videos[n - n_val :]
    video = videos[0]
    frames = len(video)
    n_val = max(math.floor(fraction * frames + 0.5), seq_len)
    if frames - n_val < seq_len:
        raise DataError(
            f"the only training video has {frames} frames, too few to split in time into train "
            f"and val sequences of seq_len={seq_len} (needs {2 * seq_len}): add training videos "
            "or pass a smaller seq_len"
        )
    return [video[: frames - n_val]], [video[frames - n_val :]]


def _swap_blocks(x, lead, blocks, out):
    """``x`` read as ``[*lead, a, b, c, d]`` (``blocks``), axes ``b`` and ``c`` swapped, as
    ``[*lead, *out]``: :func:`patchify` is this with blocks ``(nh, p, nw, p)`` and
    :func:`unpatchify` with ``(nh, nw, p, p)``, the swap being its own inverse."""
    return x.reshape(*lead, *blocks).swapaxes(-3, -2).reshape(*lead, *out)


def patchify(frames, patch: int = 16):
    """``[..., H, W] -> [..., (H/p)*(W/p), p*p]``: patches in row-major order, each row-major.

    Works on numpy and jax arrays alike.
    """
    *lead, h, w = frames.shape
    if h % patch or w % patch:
        raise DataError(
            f"frame size {h}x{w} is not divisible by patch={patch}: resize frames to a multiple "
            "of the patch size"
        )
    nh, nw = h // patch, w // patch
    return _swap_blocks(frames, lead, (nh, patch, nw, patch), (nh * nw, patch * patch))


def unpatchify(patches, height: int, width: int):
    """Exact inverse of :func:`patchify`: ``[..., N, p*p] -> [..., height, width]``."""
    *lead, num, pp = patches.shape
    patch = math.isqrt(pp)
    if patch * patch != pp:
        raise DataError(f"patch length {pp} is not a square: pass [..., N, p*p] patches")
    if height % patch or width % patch or (height // patch) * (width // patch) != num:
        raise DataError(
            f"{num} patches of {patch}x{patch} do not tile a {height}x{width} frame: pass the "
            "height and width the patches came from"
        )
    nh, nw = height // patch, width // patch
    return _swap_blocks(patches, lead, (nh, nw, patch, patch), (height, width))


def make_sequences(
    videos: Sequence[np.ndarray] | np.ndarray,
    seq_len: int,
    *,
    stride: int | None = None,
    patch: int = 16,
) -> np.ndarray:
    """Token sequences: one patch location followed over ``seq_len`` consecutive frames.

    Each video ``[F, H, W]`` gives windows starting at ``0, stride, 2*stride, ...`` (``stride``
    defaults to ``seq_len``: no frame is in two windows), each patchified. Samples are ordered by
    video, then window, then patch (row-major), so sample ``w * num_patches + k`` of a video is
    patch ``k`` of frames ``[w*stride, w*stride + seq_len)``.

    Returns:
        ``[N, seq_len, patch*patch]`` float32 with ``N = sum_v num_windows_v * num_patches``.
    """
    stride = seq_len if stride is None else stride
    if seq_len < 1 or stride < 1:
        raise DataError(f"seq_len and stride must be >= 1, got {seq_len} and {stride}")
    if len(videos) == 0:
        raise DataError("make_sequences got no videos: pass at least one [F, H, W] video")
    out = []
    for i, video in enumerate(videos):
        video = np.asarray(video, dtype=np.float32)
        if video.ndim != 3:
            raise DataError(f"video {i} has shape {video.shape}: pass [F, H, W] frames")
        num_frames = video.shape[0]
        if num_frames < seq_len:
            raise DataError(
                f"video {i} has {num_frames} frames, too few frames for one sequence of "
                f"seq_len={seq_len}: use a smaller seq_len or drop the short video"
            )
        starts = np.arange(0, num_frames - seq_len + 1, stride)  # [W]
        windows = video[starts[:, None] + np.arange(seq_len)[None, :]]  # [W, T, H, W]
        tokens = patchify(windows, patch)  # [W, T, Np, P]
        tokens = tokens.transpose(0, 2, 1, 3)  # [W, Np, T, P]
        out.append(tokens.reshape(-1, seq_len, patch * patch))
    return np.ascontiguousarray(np.concatenate(out, axis=0))


# --------------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: arrays have no boolean ==
class VideoSplits:
    """Sequences of the three splits and what made them (see :func:`load_video_data`).

    ``train``, ``val``, ``test``: ``[N, T, P]`` float32 clean sequences. ``sigma``: the standard
    deviation of the clean training pixels (the noise scale is ``gamma * sigma``).
    """

    train: np.ndarray  # [N_train, T, P]
    val: np.ndarray  # [N_val, T, P]
    test: np.ndarray  # [N_test, T, P]
    sigma: float
    seq_len: int
    patch: int
    frame_size: int
    source: str
    frames: dict[str, np.ndarray] | None = None  # split -> [F, H, W] whole frames, if kept
    # frames read, and of them the frames in no sequence (a video's last F mod T with the
    # default stride): left out of the sequences, said in the task's data line
    num_frames: int = 0
    unused_frames: int = 0


def _unused_frames(num_frames: int, seq_len: int, stride: int) -> int:
    """The frames of a video of ``num_frames`` that no window of :func:`make_sequences`
    holds (its end, and with a stride above ``seq_len`` the gaps between windows)."""
    if num_frames < seq_len:
        return num_frames
    windows = (num_frames - seq_len) // stride + 1
    covered = windows * seq_len if stride >= seq_len else (windows - 1) * stride + seq_len
    return num_frames - covered


def _cannot_read(e: OSError, data_dir) -> DataError:
    """A folder or frame the user may not read, named."""
    return DataError(
        f"cannot read '{e.filename or data_dir}' ({e.strerror or e}): check that --data-dir "
        "and its files are readable"
    )


def _real_splits(dataset, data_dir, size, max_videos, max_frames, seq_len, keep_frames) -> tuple:
    """``(train, val, test)`` videos of one real dataset folder (see :func:`load_video_data`)."""
    try:
        folders = load_videos(
            data_dir,
            dataset=dataset,
            size=size,
            max_videos=max_videos,
            max_frames=max_frames,
            min_frames=seq_len,
            keep_frames=keep_frames,
        )
    except OSError as e:
        raise _cannot_read(e, data_dir) from e
    train_v, test_v = folders["train"], folders["test"]
    if not train_v:
        raise DataError(
            f"no training videos under '{data_dir}': its Train/ (or train/, training/) "
            "folder must hold one folder of frames per video (frames directly in it are "
            "not read)"
        )
    if not test_v:
        raise DataError(
            f"need at least 1 test video under '{data_dir}', found 0: add test videos "
            f"(expected {_EXPECTED_LAYOUT[dataset]})"
        )
    scenes = training_scenes(data_dir, dataset, max_videos)
    return (*split_by_scene(train_v, scenes, seq_len), test_v)


def split_by_scene(
    videos: Sequence[np.ndarray], scenes: Sequence[str] | None, seq_len: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """:func:`split_train_val` within each scene (camera) of ``scenes`` (one name per video, in
    its order; None: one scene), so that validation draws on every scene with two or more
    videos and every scene is trained on: split as one list, ShanghaiTech's validation was its
    last cameras', which then went untrained. A scene of one video stays in training; with no
    scene of two, the whole list is split as one."""
    if scenes is None or len(set(scenes)) < 2:
        return split_train_val(videos, seq_len)
    groups: dict[str, list[np.ndarray]] = {}
    for video, scene in zip(videos, scenes, strict=True):
        groups.setdefault(scene, []).append(video)
    if all(len(g) < 2 for g in groups.values()):
        return split_train_val(videos, seq_len)
    train, val = [], []
    for group in groups.values():
        t, v = split_train_val(group, seq_len) if len(group) >= 2 else (group, [])
        train, val = train + t, val + v
    return train, val


def load_video_data(
    dataset: str = "synthetic",
    data_dir: str | Path | None = None,
    *,
    seq_len: int = 8,
    num_videos: int = 12,
    num_frames: int = 48,
    seed: int = 0,
    max_videos: int | None = None,
    max_frames: int | None = None,
    stride: int | None = None,
    size: int = 160,
    patch: int = 16,
    keep_frames: bool = False,
) -> VideoSplits:
    """Videos -> train / val / test videos -> ``[N, seq_len, patch*patch]`` sequences.

    ``keep_frames``: also keep every split's whole frames, ``frames[split] [F, size, size]``
    (for models that read frames, not patch sequences: the ViT denoiser).

    * ``"synthetic"``: ``num_videos`` clips of ``num_frames`` frames from :func:`synthetic_videos`
      (``seed``), split 70/15/15 by video.
    * ``"ucsd"``, ``"frames"``, ``"avenue"``, ``"shanghaitech"``: :func:`load_videos` on
      ``data_dir``. *test* is every test video; *val* comes from the training videos
      (:func:`split_train_val`): the last ~15% of them by sorted name (at least one, and at least
      one left for *train*), or, when there is a single training video, its last ~15% of frames
      (at least ``seq_len``; split in time). ``max_videos`` caps the videos read per split (before
      the val split) and ``max_frames`` the frames per video; ``seed`` and
      ``num_videos``/``num_frames`` are not used. A UCSD folder holding both cameras
      (``UCSDped1``, ``UCSDped2``) is split camera by camera (each its own validation videos,
      ``max_videos`` each), then joined; ShanghaiTech's training videos scene by scene
      (:func:`split_by_scene`: ``<scene>_<clip>.avi``, a scene of one video kept for *train*).
    """
    if dataset not in DATASETS:
        raise DataError(f"unknown dataset {dataset!r}: valid names are {', '.join(DATASETS)}")
    if dataset == "synthetic":
        train_v, val_v, test_v = split_videos(
            synthetic_videos(num_videos, num_frames, size=size, seed=seed)
        )
        source = f"synthetic(num_videos={num_videos}, num_frames={num_frames}, seed={seed})"
    else:
        if data_dir is None:
            raise DataError(
                f"dataset {dataset!r} needs data_dir: pass the folder holding the videos "
                f"(expected {_EXPECTED_LAYOUT[dataset]})"
            )
        # UCSD's two cameras (Ped1, Ped2) each give their own validation videos: read as one
        # list, the last ~15 % of it (the validation videos) were Ped2's alone
        train_v, val_v, test_v = [], [], []
        try:  # listing the cameras' folders is the first read of data_dir
            roots = ucsd_subsets(data_dir) if dataset == "ucsd" else [data_dir]
        except OSError as e:
            raise _cannot_read(e, data_dir) from e
        for root in roots:
            train, val, test = _real_splits(
                dataset, root, size, max_videos, max_frames, seq_len, keep_frames
            )
            train_v, val_v, test_v = train_v + train, val_v + val, test_v + test
        source = f"{dataset}:{data_dir}"
        if len(roots) > 1:  # the cameras read, each split apart
            source += f" ({', '.join(Path(r).name for r in roots)}, split apart)"
    train = make_sequences(train_v, seq_len, stride=stride, patch=patch)
    val = make_sequences(val_v, seq_len, stride=stride, patch=patch)
    test = make_sequences(test_v, seq_len, stride=stride, patch=patch)
    videos = [*train_v, *val_v, *test_v]
    step = seq_len if stride is None else stride
    unused = sum(_unused_frames(len(v), seq_len, step) for v in videos)
    frames = None
    if keep_frames:
        frames = {
            name: np.concatenate([np.asarray(v, np.float32) for v in videos])
            for name, videos in (("train", train_v), ("val", val_v), ("test", test_v))
        }
    # the decoded videos freed before the float64 pass of the noise scale over the training
    # sequences: the peak the memory check counts (cudt.data.video.frames.check_fits)
    num_frames = sum(len(v) for v in videos)
    del train_v, val_v, test_v, videos
    return VideoSplits(
        train=train,
        val=val,
        test=test,
        sigma=float(np.std(train, dtype=np.float64)),
        seq_len=seq_len,
        patch=patch,
        frame_size=size,
        source=source,
        frames=frames,
        num_frames=num_frames,
        unused_frames=unused,
    )


def perturb(x: jax.Array, gamma, sigma, key: jax.Array, first_index=0) -> jax.Array:
    """``x + gamma * sigma * N(0, 1)``, same shape and dtype as ``x``.

    The noise of sample ``i`` (along the leading axis) is drawn from ``fold_in(key, first_index +
    i)``, so a sample's noise does not depend on how the data is cut into batches: evaluating in
    batches of 64 or 512 sees the same noisy inputs. ``gamma`` and ``sigma`` may be traced scalars
    (jit, vmap over noise levels); ``gamma = 0`` returns ``x`` exactly.
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise DataError(f"perturb needs a floating-point x, got {x.dtype}: cast the data first")
    if x.ndim == 0:
        raise DataError("perturb needs x with a leading sample axis, got a scalar")
    idx = first_index + jnp.arange(x.shape[0])
    noise = jax.vmap(
        lambda i: jax.random.normal(jax.random.fold_in(key, i), x.shape[1:], dtype=x.dtype)
    )(idx)
    scale = jnp.asarray(gamma, x.dtype) * jnp.asarray(sigma, x.dtype)
    return x + scale * noise
