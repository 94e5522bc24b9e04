"""Data: synthetic and real surveillance video, split by video, as patch-token sequences."""

from cudt.data.video import (
    DATASETS,
    IMAGE_SUFFIXES,
    DataError,
    VideoSplits,
    load_frame_folders,
    load_video_data,
    make_sequences,
    patchify,
    perturb,
    split_videos,
    synthetic_videos,
    unpatchify,
)

__all__ = [
    "DATASETS",
    "IMAGE_SUFFIXES",
    "DataError",
    "VideoSplits",
    "load_frame_folders",
    "load_video_data",
    "make_sequences",
    "patchify",
    "perturb",
    "split_videos",
    "synthetic_videos",
    "unpatchify",
]
