"""The plaza generator (cudt/data/video/plaza.py): a second video source for held-out checks.

Its frames, its difference in kind from the synthetic clips (measured), and its layouts read
back by the real readers (``--dataset avenue`` and ``--dataset shanghaitech``).
"""

from __future__ import annotations

import av
import numpy as np
import pytest
from PIL import Image

from cudt.data.video import load_video_data, load_videos, synthetic_videos
from cudt.data.video.plaza import _person_parts, _sprite, plaza_videos, write_plaza
from cudt.errors import DataError

SMALL = dict(height=64, width=96)


def test_plaza_is_deterministic_per_seed_and_video():
    a = plaza_videos(2, 6, seed=3, **SMALL)
    assert a.tobytes() == plaza_videos(2, 6, seed=3, **SMALL).tobytes()
    assert not np.array_equal(a, plaza_videos(2, 6, seed=4, **SMALL))
    assert not np.array_equal(a[0], a[1])
    # Video v depends on (seed, v) only: fewer videos or frames give the same content.
    np.testing.assert_array_equal(plaza_videos(1, 6, seed=3, **SMALL)[0], a[0])
    np.testing.assert_array_equal(plaza_videos(2, 4, seed=3, **SMALL), a[:, :4])


def test_plaza_shape_range_dtype_and_refusals():
    v = plaza_videos(1, 3, height=90, width=160)
    assert v.shape == (1, 3, 90, 160) and v.dtype == np.float32
    assert v.min() >= 0.0 and v.max() <= 1.0 and v.std() > 0.05
    with pytest.raises(DataError, match="num_frames"):
        plaza_videos(1, 0)
    with pytest.raises(DataError, match="even sizes"):
        plaza_videos(1, 2, height=91)
    with pytest.raises(DataError, match="fps"):
        plaza_videos(1, 2, fps=0)
    with pytest.raises(DataError, match="seed"):
        plaza_videos(1, 2, seed=-1)


def _second_difference(v: np.ndarray) -> float:
    """Median |x[t+1] - 2 x[t] + x[t-1]|: the temporal noise floor (smooth motion gives ~0)."""
    return float(np.median(np.abs(v[:, 2:] - 2 * v[:, 1:-1] + v[:, :-2])))


def _global_drift(v: np.ndarray) -> float:
    """Mean |median over pixels of the frame-to-frame change|: light that changes everywhere."""
    step = np.diff(v.astype(np.float64), axis=1)
    return float(np.mean(np.abs(np.median(step, axis=(2, 3)))))


def test_plaza_differs_in_kind_from_the_synthetic_clips():
    """Measured on 4 clips of 12 frames from each: the plaza's camera has a noise floor and its
    light drifts; the synthetic clips are clean and lit by a constant light."""
    synthetic = synthetic_videos(4, 12, size=96, seed=0)
    plaza = plaza_videos(4, 12, height=96, width=160, seed=0)
    assert _second_difference(plaza) > 0.005 > 100 * _second_difference(synthetic)
    assert _global_drift(plaza) > 2e-4 and _global_drift(plaza) > 10 * _global_drift(synthetic)
    # People move in every frame step of every clip, over a background that mostly holds still.
    diff = np.abs(np.diff(plaza, axis=1))
    for i in range(len(plaza)):
        assert (diff[i].max(axis=(1, 2)) > 0.1).all(), i
        assert 1e-3 < (diff[i] > 0.1).mean() < 0.1, i


def _rows_and_width(parts, scale: float) -> tuple[int, int]:
    rows, cols, cover, _ = _sprite(parts, 200.0, 380.0, scale, 400, 400)
    covered = cover > 0.5
    return int(covered.any(axis=1).sum()), int(covered.any(axis=0).sum())


def test_people_shrink_with_distance_and_swing_their_legs():
    person = {"h": 1.75, "build": 1.0, "speed": 1.3, "top": 0.2, "bottom": 0.5, "hair": 0.1,
              "skin": 0.5, "bag": None}  # fmt: skip
    sideways = np.array([1.0, 0.0])
    near = _rows_and_width(_person_parts(person, sideways, 0.0), 200.0)[0]
    far = _rows_and_width(_person_parts(person, sideways, 0.0), 100.0)[0]
    assert abs(near / far - 2.0) < 0.1, (near, far)  # twice as far: half as tall
    together = _rows_and_width(_person_parts(person, sideways, 0.0), 200.0)[1]
    apart = _rows_and_width(_person_parts(person, sideways, np.pi / 2), 200.0)[1]
    assert apart > 1.5 * together, (together, apart)  # mid-stride the legs spread


@pytest.mark.parametrize("layout", ["avenue", "shanghaitech"])
def test_write_plaza_is_read_back_by_the_real_reader(layout, tmp_path):
    top = write_plaza(tmp_path, layout=layout, train_videos=2, test_videos=1, num_frames=8,
                      height=64, width=96, fps=12)  # fmt: skip
    got = load_videos(top, dataset=layout, size=64)
    assert [len(v) for v in got["train"]] == [8, 8] and [len(v) for v in got["test"]] == [8]
    frames = plaza_videos(3, 8, height=64, width=96, fps=12)
    for decoded, video in zip(got["train"] + got["test"], frames, strict=True):
        resized = np.stack(
            [
                np.asarray(
                    Image.fromarray(np.rint(f * 255).astype(np.uint8)).resize(
                        (64, 64), Image.Resampling.BILINEAR
                    ),
                    np.float32,
                )
                / 255
                for f in video
            ]
        )
        err = np.abs(decoded[:, None] - resized[None]).mean(axis=(2, 3))  # [F_got, F_written]
        assert err.diagonal().max() < 0.012, err.diagonal()  # MPEG-4 / JPEG loss only
        # frame order: only a few % of the pixels change between frames, so a frame dropped or
        # repeated stays within the loss above; each decoded frame must be nearest its own
        np.testing.assert_array_equal(err.argmin(axis=1), np.arange(len(resized)))
    first = min(p for p in top.rglob("*.avi") if not p.name.startswith("."))  # no AppleDouble
    with av.open(str(first)) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height, stream.average_rate) == (96, 64, 12)
    data = load_video_data(layout, top, seq_len=4)
    # 1 training video for train and 1 held out for val, 2 windows of 4 frames, 100 patches
    assert data.train.shape == data.val.shape == data.test.shape == (200, 4, 256)


@pytest.mark.parametrize("layout", ["avenue", "shanghaitech"])
def test_plaza_validation_holds_out_as_many_videos_in_either_layout(layout, tmp_path):
    """Every plaza video is a scene of its own, and the ShanghaiTech layout names it so: named
    in pairs as two clips of one camera, the reader's split by scene held out one of each pair
    for validation (3 of 7 training videos; the Avenue layout 1)."""
    top = write_plaza(tmp_path, layout=layout, train_videos=7, test_videos=1, num_frames=4,
                      height=32, width=32)  # fmt: skip
    data = load_video_data(layout, top, seq_len=4, size=16)  # one sequence a video
    assert (len(data.train), len(data.val), len(data.test)) == (6, 1, 1)


@pytest.mark.parametrize("layout", ["avenue", "shanghaitech"])
def test_write_plaza_holds_one_video_at_a_time(layout, tmp_path):
    """write_plaza makes each video as it writes it: its peak memory does not grow with the
    number of videos (it held them all as float32, and a uint8 copy in the writers: a
    large --train-videos / --frames request of experiments.held_out_data ran out of memory)."""
    import tracemalloc

    one = 6 * 64 * 96 * 4  # one video's float32 frames
    # first, a write that sets up what any first write does (the encoder's own allocations)
    write_plaza(tmp_path / "0", layout=layout, train_videos=1, test_videos=1, num_frames=1,
                height=32, width=32)  # fmt: skip
    peaks = []
    for n in (1, 6):
        tracemalloc.start()
        write_plaza(tmp_path / str(n), layout=layout, train_videos=n, test_videos=1, num_frames=6,
                    **SMALL)  # fmt: skip
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] - peaks[0] < one, peaks  # was about one video more for each video added
