"""Data: synthetic and real surveillance video, split by video, as patch-token sequences."""

from cudt.data.video import (
    DATASETS,
    IMAGE_SUFFIXES,
    VIDEO_SUFFIX,
    DataError,
    VideoSplits,
    load_frame_folders,
    load_video_data,
    load_videos,
    make_sequences,
    patchify,
    perturb,
    split_train_val,
    split_videos,
    synthetic_videos,
    unpatchify,
)

__all__ = [
    "DATASETS",
    "IMAGE_SUFFIXES",
    "VIDEO_SUFFIX",
    "DataError",
    "VideoSplits",
    "load_frame_folders",
    "load_video_data",
    "load_videos",
    "make_sequences",
    "patchify",
    "perturb",
    "split_train_val",
    "split_videos",
    "synthetic_videos",
    "unpatchify",
]

# Text classification data (synthetic sentiment, IMDb, MNLI, aclImdb).
from cudt.data.text import (  # noqa: E402
    TEXT_DATASETS,
    TextSplit,
    TextSplits,
    load_text_data,
    load_tfds_text,
    read_aclimdb,
    synthetic_sentiment,
    synthetic_sentiment_score,
    tokenize_split,
)

__all__ += [
    "TEXT_DATASETS",
    "TextSplit",
    "TextSplits",
    "load_text_data",
    "load_tfds_text",
    "read_aclimdb",
    "synthetic_sentiment",
    "synthetic_sentiment_score",
    "tokenize_split",
]
