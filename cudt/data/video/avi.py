"""Decoding ``.avi`` videos (CUHK Avenue, ShanghaiTech training) into grayscale frames with PyAV.

Frames are decoded one at a time and only the resized ``size x size`` float32 copy is kept, so a
long video never sits in memory at its native resolution. Preprocessing is the one the frame-folder
reader applies to image files: 8-bit grayscale (``format="gray"``: FFmpeg converts the luma to
full range, as PIL's ``convert("L")`` does for a JPEG), bilinear resize with PIL, scaled by 1/255.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image

from cudt.errors import DataError

__all__ = ["listed_frames", "read_avi"]

# A stream that decodes to fewer than this fraction of the frames its header lists is refused as
# truncated or corrupt. Not 1.0: some real files count dropped (empty) frames in their header.
_MIN_DECODED_FRACTION = 0.9
# The header's frame count sizes the first buffer; a corrupt header must not allocate gigabytes.
_MAX_PREALLOCATED = 2048
_UNKNOWN_LENGTH = 256  # first buffer when the header lists no frame count

_FIX = "re-download or re-extract that video, or delete the file"


def _cannot_decode(path: Path, reason: str) -> DataError:
    return DataError(f"cannot decode video '{path}' ({reason}): {_FIX}")


def listed_frames(path: str | Path) -> int | None:
    """The frame count a video's header lists (its duration times its rate where it lists
    none), read without decoding; None where the file cannot be opened or says neither (the
    decoder then names the problem)."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            if stream.frames:
                return int(stream.frames)
            if stream.duration and stream.time_base and stream.average_rate:
                return int(stream.duration * stream.time_base * stream.average_rate)
    except (av.FFmpegError, OSError):
        return None
    return None


def read_avi(
    path: str | Path,
    *,
    size: int = 160,
    max_frames: int | None = None,
    min_frames: int = 1,
) -> np.ndarray:
    """``[F, size, size]`` float32 in ``[0, 1]``: the first ``max_frames`` frames of one video.

    Raises :class:`DataError` (one line, naming the file) for a file FFmpeg cannot open or decode,
    one with no video stream, an image renamed ``.avi``, a truncated file (a packet cut short, or
    fewer than 90% of the frames its header lists), frames of different sizes, and a video with
    fewer than ``min_frames`` frames. Permission errors propagate as :class:`OSError`.
    """
    path = Path(path)
    try:
        with av.open(str(path)) as container:
            fmt = container.format.name
            if fmt == "image2" or fmt.endswith("_pipe"):
                raise _cannot_decode(path, f"it is an image ({fmt}), not a video")
            if not container.streams.video:
                raise _cannot_decode(path, "no video stream in it")
            stream = container.streams.video[0]
            listed = int(stream.frames or 0)
            limit = min(listed or _UNKNOWN_LENGTH, _MAX_PREALLOCATED)
            if max_frames is not None:
                limit = min(limit, max_frames)
            buf = np.empty((max(1, limit), size, size), np.float32)  # grown if too short
            count = 0
            first: tuple[int, int] | None = None
            for packet in container.demux(stream):
                if packet.is_corrupt:
                    raise _cannot_decode(path, "truncated or corrupt: a packet is cut short")
                for frame in packet.decode():
                    if first is None:
                        first = (frame.width, frame.height)
                    elif (frame.width, frame.height) != first:
                        raise DataError(
                            f"frames in video '{path}' differ in size: frame 0 is "
                            f"{first[0]}x{first[1]} but frame {count} is "
                            f"{frame.width}x{frame.height}; re-encode the video so all its "
                            "frames have one size"
                        )
                    if count == len(buf):  # the header undercounted: grow
                        buf = np.concatenate([buf, np.empty_like(buf)])
                    gray = Image.fromarray(frame.to_ndarray(format="gray"))
                    gray = gray.resize((size, size), Image.Resampling.BILINEAR)
                    buf[count] = np.asarray(gray, dtype=np.float32) / np.float32(255.0)
                    count += 1
                    if max_frames is not None and count >= max_frames:
                        break
                if max_frames is not None and count >= max_frames:
                    break
            else:  # read to the end: every listed frame must have come out
                if listed and count < _MIN_DECODED_FRACTION * listed:
                    raise _cannot_decode(
                        path,
                        f"truncated or corrupt: decoded {count} of the {listed} frames its "
                        "header lists",
                    )
    except av.FFmpegError as exc:
        if isinstance(exc, PermissionError):
            raise  # "cannot read", reported by the caller like any unreadable file
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise _cannot_decode(path, reason.splitlines()[0]) from exc
    if count == 0:
        raise _cannot_decode(path, "no frame could be decoded")
    if count < min_frames:
        capped = f" (max_frames={max_frames})" if count == max_frames else ""
        raise DataError(
            f"video '{path}' has {count} frames{capped}, too few frames for one sequence of "
            f"seq_len={min_frames}: pass a smaller --seq-len or remove that video"
        )
    return buf[:count].copy() if count < len(buf) else buf
