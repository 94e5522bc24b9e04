"""Video data for the denoising experiments: synthetic surveillance clips, frame folders, sequences.

Preprocessing follows the paper: grayscale, resize to 160x160, 16x16 patches, so one frame is 100
tokens of 256 pixels. A model *sequence* is one patch location followed over ``T`` consecutive
frames: ``[T, 256]``. Pixel values are float32 in ``[0, 1]``.

Pipeline::

    videos [F, H, W] per video  --split_videos (by video)-->  train / val / test videos
        --make_sequences-->  [N, T, P]  --perturb(x, gamma, sigma, key)-->  noisy input

Sources (``load_video_data(dataset=...)``):

* ``"synthetic"``: :func:`synthetic_videos`, a procedural stand-in for surveillance footage
  (textured static background, walkway, fixed structures, moving occluding objects, slow camera
  drift), split 70/15/15 by video.
* ``"ucsd"``: UCSD Anomaly frame folders (``UCSDped1|UCSDped2/Train/Train001/001.tif``).
* ``"frames"``: the generic ``{train,test}/<video>/<frame>.png`` layout (Avenue / ShanghaiTech after
  extracting frames; ``training/testing`` and a ``frames/`` level are accepted too).
* ``"avenue"``: CUHK Avenue as its archive extracts (``Avenue Dataset/training_videos/01.avi``,
  ``testing_videos/01.avi``), decoded with PyAV (:mod:`cudt.data.video.avi`).
* ``"shanghaitech"``: ShanghaiTech Campus as its archive extracts
  (``shanghaitech/training/videos/01_001.avi``, ``testing/frames/01_0014/000.jpg``).

For every real dataset the split rule is the same (:func:`split_train_val`): *test* is every test
video, *val* the last ~15% of the training videos by sorted name (at least one, and at least one
left for *train*), *train* the rest. With a single training video, its last ~15% of frames (at
least ``seq_len``) are *val* instead. The test videos hold the anomalies and stay untouched.

Modules: :mod:`~cudt.data.video.synthetic` (the generator), :mod:`~cudt.data.video.frames` (the
real datasets' readers), :mod:`~cudt.data.video.avi` (PyAV), :mod:`~cudt.data.video.splits`
(splits, sequences, :func:`load_video_data`, :func:`perturb`), :mod:`~cudt.data.video.archives`
(tiny copies written in each archive's layout), :mod:`~cudt.data.video.plaza` (a second
generator for held-out checks, never used to choose anything: :func:`plaza_videos`, written in
the Avenue or ShanghaiTech layout by :func:`write_plaza` and read through those datasets).
"""

from cudt.data.video.frames import (
    DATASETS,
    IMAGE_SUFFIXES,
    VIDEO_SUFFIX,
    load_frame_folders,
    load_videos,
)
from cudt.data.video.plaza import plaza_videos, write_plaza
from cudt.data.video.splits import (
    VAL_FRACTION,
    VideoSplits,
    load_video_data,
    make_sequences,
    patchify,
    perturb,
    split_train_val,
    split_videos,
    unpatchify,
)
from cudt.data.video.synthetic import synthetic_videos
from cudt.errors import DataError

__all__ = [
    "DATASETS",
    "IMAGE_SUFFIXES",
    "VAL_FRACTION",
    "VIDEO_SUFFIX",
    "DataError",
    "VideoSplits",
    "load_frame_folders",
    "load_video_data",
    "load_videos",
    "make_sequences",
    "patchify",
    "perturb",
    "plaza_videos",
    "split_train_val",
    "split_videos",
    "synthetic_videos",
    "unpatchify",
    "write_plaza",
]
