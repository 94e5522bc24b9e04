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
  ``testing_videos/01.avi``), decoded with PyAV (:mod:`cudt.data.avi`).
* ``"shanghaitech"``: ShanghaiTech Campus as its archive extracts
  (``shanghaitech/training/videos/01_001.avi``, ``testing/frames/01_0014/000.jpg``).

For every real dataset the split rule is the same (:func:`split_train_val`): *test* is every test
video, *val* the last ~15% of the training videos by sorted name (at least one, and at least one
left for *train*), *train* the rest. With a single training video, its last ~15% of frames (at
least ``seq_len``) are *val* instead. The test videos hold the anomalies and stay untouched.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, UnidentifiedImageError

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
    "split_train_val",
    "split_videos",
    "synthetic_videos",
    "unpatchify",
]

DATASETS: tuple[str, ...] = ("synthetic", "ucsd", "frames", "avenue", "shanghaitech")
IMAGE_SUFFIXES: frozenset[str] = frozenset({".tif", ".tiff", ".png", ".jpg", ".jpeg", ".bmp"})
VIDEO_SUFFIX = ".avi"
# Fraction of the training videos (or, with one training video, of its frames) held out as val.
VAL_FRACTION = 0.15
# The training-video folder that identifies each dataset stored as video files.
_VIDEO_MARKERS = {"avenue": ("training_videos",), "shanghaitech": ("training", "videos")}

# Split-folder names as shipped by UCSD (Train/Test) and by the common extracted-frames layouts
# (train/test, training/testing); matched case-insensitively.
_SPLIT_NAMES = {"train": "train", "training": "train", "test": "test", "testing": "test"}

_EXPECTED_LAYOUT = {
    "ucsd": "root/UCSDped2/Train/Train001/001.tif "
    "(or root = UCSDped2, or a folder with Train/Test)",
    "frames": "root/{train,test}/<video>/<frame>.{tif,png,jpg,bmp} "
    "(training/testing and a frames/ level are accepted)",
    "avenue": "root/training_videos/01.avi and root/testing_videos/01.avi "
    "(root = 'Avenue Dataset' or the folder holding it)",
    "shanghaitech": "root/training/videos/01_001.avi and root/testing/frames/01_0014/000.jpg "
    "(root = shanghaitech or the folder holding it)",
}


# --------------------------------------------------------------------------------------------------
# Synthetic surveillance video
# --------------------------------------------------------------------------------------------------


def synthetic_videos(
    num_videos: int, num_frames: int, *, size: int = 160, seed: int = 0
) -> np.ndarray:
    """Procedural surveillance-like clips, deterministic in ``(seed, video index)``.

    Each video has a static textured background (smooth low-frequency shading, a walkway or road
    band with curbs and paving, fixed rectangles and poles, fine texture), 3-8 moving objects
    (pedestrians: ellipse body, head, gait, striped clothes; vehicles: rounded boxes with windows,
    faster) with soft shadows, entering and leaving the view and occluding each other in a fixed
    near-to-far draw order, and a slow bounded sub-pixel camera drift (bilinear shift of a larger
    canvas). No noise is added: the output is the clean signal.

    Video ``v`` depends only on ``(seed, v, size)``: it is the same whatever ``num_videos`` is, and
    a shorter ``num_frames`` gives a prefix of a longer one.

    Returns:
        ``[V, F, size, size]`` float32 in ``[0, 1]``.
    """
    if num_videos < 1 or num_frames < 1:
        raise DataError(
            f"synthetic_videos needs num_videos >= 1 and num_frames >= 1, got {num_videos} and "
            f"{num_frames}: pass positive counts"
        )
    if size < 16:
        raise DataError(f"synthetic_videos needs size >= 16, got {size}: pass a larger size")
    if seed < 0:
        raise DataError(f"synthetic_videos needs seed >= 0, got {seed}: pass a non-negative seed")
    out = np.empty((num_videos, num_frames, size, size), np.float32)  # [V, F, S, S]
    for v in range(num_videos):
        # One independent stream per (seed, video): videos do not depend on num_videos.
        rng = np.random.default_rng([seed, v])
        out[v] = _render_video(rng, num_frames, size)
    return out


def _smooth_matrix(n_out: int, n_in: int) -> np.ndarray:
    """``[n_out, n_in]`` smoothstep interpolation weights: ``M @ grid`` upsamples one axis."""
    pos = np.linspace(0.0, n_in - 1.0, n_out)
    i0 = np.minimum(np.floor(pos).astype(np.int64), n_in - 2)
    w = pos - i0
    w = w * w * (3.0 - 2.0 * w)  # smoothstep: no visible creases at the coarse grid lines
    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    m[rows, i0] = 1.0 - w
    m[rows, i0 + 1] = w
    return m


def _value_noise(rng: np.random.Generator, n: int, cells: int) -> np.ndarray:
    """``[n, n]`` smooth noise with about ``cells`` features per side, unit-ish amplitude."""
    grid = rng.normal(size=(cells + 1, cells + 1))
    m = _smooth_matrix(n, cells + 1)
    return m @ grid @ m.T


def _box_blur3(a: np.ndarray) -> np.ndarray:
    """3x3 box blur with edge padding (tames pixel-level texture so drift changes it smoothly)."""
    p = np.pad(a, 1, mode="edge")
    n0, n1 = a.shape
    return sum(p[i : i + n0, j : j + n1] for i in range(3) for j in range(3)) / 9.0


def _render_background(rng: np.random.Generator, c: int, sc: float) -> tuple[np.ndarray, dict]:
    """Static ``[c, c]`` canvas and the walkway geometry (objects move along it)."""
    yy, xx = np.mgrid[0:c, 0:c].astype(np.float64)
    mid = (c - 1) / 2.0
    bg = np.full((c, c), rng.uniform(0.35, 0.6))
    # Smooth shading: three octaves of value noise plus a gentle global gradient (vignette-ish).
    for cells, amp in ((3, 0.10), (7, 0.05), (16, 0.025)):
        bg += amp * _value_noise(rng, c, cells)
    g_angle = rng.uniform(0, 2 * np.pi)
    bg += 0.08 * ((xx - mid) * np.cos(g_angle) + (yy - mid) * np.sin(g_angle)) / c

    # Walkway / road band: direction u, normal n, centre offset, half width.
    theta = rng.uniform(0, np.pi)
    u = np.array([np.cos(theta), np.sin(theta)])  # (x, y)
    n = np.array([-u[1], u[0]])
    offset = rng.uniform(-0.12, 0.12) * c
    half_w = rng.uniform(0.14, 0.26) * c
    along = (xx - mid) * u[0] + (yy - mid) * u[1]
    across = (xx - mid) * n[0] + (yy - mid) * n[1] - offset
    inside = np.clip(half_w - np.abs(across) + 0.5, 0.0, 1.0)
    is_road = bool(rng.random() < 0.4)
    band_shift = rng.choice([-1.0, 1.0]) * rng.uniform(0.08, 0.2)
    bg += band_shift * inside
    curb = np.exp(-(((np.abs(across) - half_w) / (1.2 * max(sc, 0.5))) ** 2))
    bg += rng.choice([-1.0, 1.0]) * rng.uniform(0.08, 0.18) * curb
    period = max(4.0, rng.uniform(10, 18) * sc)
    if is_road:
        # Dashed centre line.
        dash = (np.mod(along, 2 * period) < period) & (np.abs(across) < 0.9 * max(sc, 0.6))
        bg += 0.25 * dash
    else:
        # Paving joints along and across the walkway.
        d_al = np.abs(np.mod(along + period / 2, period) - period / 2)
        d_ac = np.abs(np.mod(across + period / 2, period) - period / 2)
        joints = np.maximum(np.exp(-(d_al**2) / 0.8), np.exp(-(d_ac**2) / 0.8))
        bg -= 0.05 * joints * inside

    # Fixed structures: rectangles (buildings, planters, benches) mostly off the walkway.
    for _ in range(int(rng.integers(2, 6))):
        for _attempt in range(8):
            hw, hh = rng.uniform(5, 26, size=2) * sc
            cx, cy = rng.uniform(0, c, size=2)
            box = np.clip(np.minimum(hw - np.abs(xx - cx), hh - np.abs(yy - cy)) + 0.5, 0.0, 1.0)
            if (box * inside).sum() < 0.2 * box.sum() + 1e-9:
                break
        value = rng.uniform(0.1, 0.9)
        shade = 0.04 * np.sin((xx - cx) * rng.uniform(0.3, 1.2) + rng.uniform(0, 6.3))
        bg = bg * (1 - box) + box * (value + shade)
        # A darker outline makes it read as a structure rather than a blob.
        rim = np.clip(
            1.0 - np.abs(np.minimum(hw - np.abs(xx - cx), hh - np.abs(yy - cy))), 0.0, 1.0
        )
        bg -= 0.08 * rim
    # Poles / lines: thin segments.
    for _ in range(int(rng.integers(1, 4))):
        x0, y0 = rng.uniform(0, c, size=2)
        ang = rng.uniform(0, np.pi)
        length = rng.uniform(15, 70) * sc
        t = np.clip((xx - x0) * np.cos(ang) + (yy - y0) * np.sin(ang), 0, length)
        dist = np.hypot(xx - (x0 + t * np.cos(ang)), yy - (y0 + t * np.sin(ang)))
        width = rng.uniform(0.6, 1.6) * max(sc, 0.5)
        bg += rng.choice([-1.0, 1.0]) * rng.uniform(0.12, 0.3) * np.clip(width - dist + 0.5, 0, 1)

    # Fine texture: coarser (grass/gravel) off the walkway, finer on it.
    fine = _box_blur3(rng.normal(size=(c, c)))
    bg += fine * (0.06 * (1 - inside) + 0.025 * inside)
    geometry = {"u": u, "n": n, "offset": offset, "half_w": half_w, "road": is_road}
    return np.clip(bg, 0.02, 0.98), geometry


def _soft(d: np.ndarray) -> np.ndarray:
    """Antialiased coverage from a signed distance in pixels (negative = inside)."""
    return np.clip(0.5 - d, 0.0, 1.0)


def _make_object(rng: np.random.Generator, kind: str, sc: float) -> dict:
    if kind == "pedestrian":
        a = max(rng.uniform(2.5, 5.0) * sc, 1.0)  # half width of the body
        b = max(rng.uniform(6.0, 12.0) * sc, 1.5)  # half height of the body
        r = 0.75 * a
        return {
            "kind": kind,
            "a": a,
            "b": b,
            "head_r": r,
            "radius": b + 2.0 * r + 1.0,
            "speed": rng.uniform(0.3, 1.4) * sc,
            "gait_freq": rng.uniform(0.25, 0.5),
            "gait_phase": rng.uniform(0, 2 * np.pi),
            "top": _contrasting_value(rng),
            "bottom": _contrasting_value(rng),
            "head": rng.uniform(0.15, 0.6),
            "stripe_amp": rng.uniform(0.0, 0.12),
            "stripe_freq": rng.uniform(0.6, 1.6) / max(sc, 0.5),
            "stripe_phase": rng.uniform(0, 2 * np.pi),
        }
    half_l = max(rng.uniform(8.0, 16.0) * sc, 2.0)
    half_w = max(rng.uniform(4.0, 7.5) * sc, 1.5)
    return {
        "kind": kind,
        "half_l": half_l,
        "half_w": half_w,
        "corner": 0.35 * half_w,
        "radius": math.hypot(half_l, half_w) + 1.0,
        "speed": rng.uniform(1.8, 4.0) * sc,
        "value": _contrasting_value(rng),
        "window": rng.choice([-1.0, 1.0]) * rng.uniform(0.15, 0.3),
    }


def _contrasting_value(rng: np.random.Generator) -> float:
    # Mostly dark or light clothing/paint so objects stand out; sometimes mid grey (hard cases).
    pick = rng.random()
    if pick < 0.4:
        return float(rng.uniform(0.03, 0.28))
    if pick < 0.8:
        return float(rng.uniform(0.7, 0.97))
    return float(rng.uniform(0.3, 0.7))


def _sprite(obj: dict, dx: np.ndarray, dy: np.ndarray, t: np.ndarray, u: np.ndarray) -> tuple:
    """Coverage and brightness of one object on local grids ``dx, dy`` (pixels from its centre).

    ``dx`` is ``[F, 1, w]``, ``dy`` is ``[F, h, 1]``, ``t`` is ``[F, 1, 1]``; returns
    ``(mask, value)`` each ``[F, h, w]``. Texture is in object coordinates so it moves with it.
    """
    if obj["kind"] == "pedestrian":
        a, b, r = obj["a"], obj["b"], obj["head_r"]
        # Gait: the lower half (legs) narrows and widens with the stride.
        stride = 0.65 + 0.35 * np.abs(np.sin(obj["gait_freq"] * t + obj["gait_phase"]))
        a_eff = np.where(dy > 0, a * stride, a)
        rho = np.sqrt((dx / a_eff) ** 2 + (dy / b) ** 2)
        body = _soft((rho - 1.0) * np.minimum(a_eff, b))
        head_cy = -b - 0.6 * r
        head = _soft(np.sqrt(dx**2 + (dy - head_cy) ** 2) - r)
        torso = np.clip(0.5 - dy / 2.0, 0.0, 1.0)  # smooth top/bottom colour change at dy = 0
        value = obj["bottom"] + (obj["top"] - obj["bottom"]) * torso
        value = value + obj["stripe_amp"] * np.sin(obj["stripe_freq"] * dy + obj["stripe_phase"])
        value = value * (1 - head) + obj["head"] * head
        return np.maximum(body, head), value
    # Vehicle: rounded box aligned with its motion direction u, a window band at the front.
    al = dx * u[0] + dy * u[1]
    ac = -dx * u[1] + dy * u[0]
    rc = obj["corner"]
    qx = np.abs(al) - (obj["half_l"] - rc)
    qy = np.abs(ac) - (obj["half_w"] - rc)
    sdf = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0)) + np.minimum(np.maximum(qx, qy), 0) - rc
    mask = _soft(sdf)
    hl, hw = obj["half_l"], obj["half_w"]
    window = _soft(np.maximum(np.abs(al - 0.45 * hl) - 0.2 * hl, np.abs(ac) - 0.7 * hw))
    value = obj["value"] + obj["window"] * window
    return mask, value


def _render_video(rng: np.random.Generator, num_frames: int, size: int) -> np.ndarray:
    """``[F, size, size]`` float32 clip; all random draws come before any per-frame work, so the
    content does not depend on ``num_frames`` (a shorter clip is a prefix of a longer one)."""
    sc = size / 160.0
    # Camera drift: slow bounded sinusoids (sub-pixel per frame): any clip length fits the canvas.
    amp = rng.uniform(1.0, 5.0, size=2) * sc
    period = rng.uniform(150.0, 400.0, size=2)
    phase = rng.uniform(0, 2 * np.pi, size=2)
    margin = int(math.ceil(5.0 * sc)) + 2
    canvas = size + 2 * margin
    bg, geo = _render_background(rng, canvas, sc)

    u_band, n_band = geo["u"], geo["n"]
    num_objects = int(rng.integers(3, 9))
    light = rng.uniform(-1, 1, size=2)
    light = light / (np.linalg.norm(light) + 1e-9) * rng.uniform(1.5, 3.5) * sc  # shadow offset
    drift_bound = 5.0 * sc
    objects = []
    for i in range(num_objects):
        vehicle_p = 0.45 if geo["road"] else 0.15
        kind = "vehicle" if rng.random() < vehicle_p else "pedestrian"
        obj = _make_object(rng, kind, sc)
        if kind == "pedestrian" and rng.random() < 0.2:
            ang = rng.uniform(-np.pi, np.pi)  # someone crossing at an arbitrary angle
        else:
            ang = rng.normal(0.0, 0.12 if kind == "pedestrian" else 0.0)
        ca, sa = np.cos(ang), np.sin(ang)
        u = np.array([u_band[0] * ca - u_band[1] * sa, u_band[0] * sa + u_band[1] * ca])
        u = u * rng.choice([-1.0, 1.0])
        lateral = geo["offset"] + rng.uniform(-0.85, 0.85) * geo["half_w"]
        anchor = n_band * lateral  # a point of the path, relative to the canvas centre
        sway = rng.uniform(0.0, 1.0) * sc if kind == "pedestrian" else 0.0
        # Wrap the path parameter at |s| = reach, where the object is out of view on either side,
        # so objects leave and (much later) re-enter without ever popping in view.
        k = int(np.argmax(np.abs(u)))
        extent = size / 2 + obj["radius"] + np.abs(light).max() + drift_bound + 2.0
        reach = (extent + np.abs(anchor).max() + sway) / abs(u[k])
        # The first two objects start in view so every clip has visible motion from frame 0.
        s0 = rng.uniform(-0.3, 0.3) * size if i < 2 else rng.uniform(-reach, reach)
        obj.update(
            u=u,
            anchor=anchor,
            reach=reach,
            s0=s0,
            sway=sway,
            sway_freq=rng.uniform(0.05, 0.15),
            sway_phase=rng.uniform(0, 2 * np.pi),
        )
        objects.append(obj)
    # Near-to-far draw order: objects whose path is lower in the image are closer to the camera.
    objects.sort(key=lambda o: o["anchor"][1])

    t = np.arange(num_frames, dtype=np.float64)
    off = amp[:, None] * np.sin(2 * np.pi * t[None, :] / period[:, None] + phase[:, None])
    ox, oy = margin + off[0], margin + off[1]  # [F] canvas position of the frame's top-left
    ix, iy = np.floor(ox).astype(np.int64), np.floor(oy).astype(np.int64)
    fx, fy = ox - ix, oy - iy

    frames = np.empty((num_frames, size, size))  # [F, S, S]
    for f in range(num_frames):
        y0, x0 = iy[f], ix[f]
        a00 = bg[y0 : y0 + size, x0 : x0 + size]
        a01 = bg[y0 : y0 + size, x0 + 1 : x0 + 1 + size]
        a10 = bg[y0 + 1 : y0 + 1 + size, x0 : x0 + size]
        a11 = bg[y0 + 1 : y0 + 1 + size, x0 + 1 : x0 + 1 + size]
        frames[f] = (1 - fy[f]) * ((1 - fx[f]) * a00 + fx[f] * a01) + fy[f] * (
            (1 - fx[f]) * a10 + fx[f] * a11
        )

    centre = (canvas - 1) / 2.0
    tt = t[:, None, None]  # [F, 1, 1]
    for obj in objects:
        s = np.mod(obj["s0"] + obj["speed"] * t + obj["reach"], 2 * obj["reach"]) - obj["reach"]
        side = obj["sway"] * np.sin(obj["sway_freq"] * t + obj["sway_phase"])
        u, nrm = obj["u"], np.array([-obj["u"][1], obj["u"][0]])
        # Object centre in frame pixel coordinates (canvas position minus camera offset).
        px = centre + obj["anchor"][0] + u[0] * s + nrm[0] * side - ox  # [F]
        py = centre + obj["anchor"][1] + u[1] * s + nrm[1] * side - oy
        half = int(math.ceil(obj["radius"] + np.abs(light).max())) + 2
        span = np.arange(-half, half + 1)
        cx, cy = np.round(px).astype(np.int64), np.round(py).astype(np.int64)
        dx = (cx[:, None] + span[None, :] - px[:, None])[:, None, :]  # [F, 1, w]
        dy = (cy[:, None] + span[None, :] - py[:, None])[:, :, None]  # [F, h, 1]
        mask, value = _sprite(obj, dx, dy, tt, u)
        shadow, _ = _sprite(obj, dx - light[0], dy - light[1], tt, u)
        shadow = 0.3 * shadow
        for f in range(num_frames):
            ya, yb = max(cy[f] - half, 0), min(cy[f] + half + 1, size)
            xa, xb = max(cx[f] - half, 0), min(cx[f] + half + 1, size)
            if ya >= yb or xa >= xb:
                continue  # out of view this frame
            ly = slice(ya - (cy[f] - half), yb - (cy[f] - half))
            lx = slice(xa - (cx[f] - half), xb - (cx[f] - half))
            region = frames[f, ya:yb, xa:xb]  # a view: composited in place
            region *= 1.0 - shadow[f, ly, lx]
            m = mask[f, ly, lx]
            region += m * (value[f, ly, lx] - region)
    return np.clip(frames, 0.0, 1.0).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# Frame folders
# --------------------------------------------------------------------------------------------------


def _natural_key(path: Path) -> tuple:
    """Sort ``2.tif`` before ``10.tif``: digit runs compare as numbers."""
    parts = re.split(r"(\d+)", path.name.lower())
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def _visible_dirs(folder: Path) -> list[Path]:
    return sorted(
        (p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=_natural_key,
    )


def _split_dirs(folder: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {"train": [], "test": []}
    for child in _visible_dirs(folder):
        split = _SPLIT_NAMES.get(child.name.lower())
        if split is not None:
            found[split].append(child)
    return found


def _video_dirs(split_dir: Path) -> list[Path]:
    """Video folders of one split; UCSD ``*_gt`` mask folders are not videos."""
    dirs = [p for p in _visible_dirs(split_dir) if not p.name.lower().endswith("_gt")]
    # The common extracted layout has one more level: training/frames/<video>/.
    if len(dirs) == 1 and dirs[0].name.lower() == "frames":
        return _video_dirs(dirs[0])
    return dirs


def _read_video(folder: Path, size: int, max_frames: int | None, min_frames: int = 1) -> np.ndarray:
    """``[F, size, size]`` float32 in ``[0, 1]`` from one folder of frames."""
    files = sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
        ),
        key=_natural_key,
    )
    if not files:
        others = sorted(
            {p.suffix.lower() or p.name for p in folder.iterdir() if not p.name.startswith(".")}
        )
        found = f", only {', '.join(others[:3])} files" if others else ""
        raise DataError(
            f"video folder '{folder}' has no image frames "
            f"({', '.join(sorted(IMAGE_SUFFIXES))}){found}: point data_dir at a video dataset "
            "of frame folders, or extract this video's frames there"
        )
    if max_frames is not None:
        files = files[:max_frames]
    if len(files) < min_frames:
        raise DataError(
            f"video folder '{folder}' has {len(files)} frames, too few frames for one sequence "
            f"of seq_len={min_frames}: pass a smaller --seq-len or remove that folder"
        )
    frames = np.empty((len(files), size, size), np.float32)
    first_size: tuple[int, int] | None = None
    for i, path in enumerate(files):
        try:
            # PIL warns (e.g. "Corrupt EXIF data") on stderr about files it can still decode or
            # is about to refuse; a frame either decodes or raises the one DataError below.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Image.open(path) as im:
                    gray = im.convert("L")  # forces the decode, so truncated files fail here
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            if isinstance(exc, UnidentifiedImageError):
                reason = "not an image file PIL can read"
            else:
                reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise DataError(
                f"cannot decode frame '{path}' ({reason}): re-extract that frame or delete the file"
            ) from exc
        if first_size is None:
            first_size = gray.size
        elif gray.size != first_size:
            raise DataError(
                f"frames in video folder '{folder}' differ in size: {files[0].name} is "
                f"{first_size[0]}x{first_size[1]} but {path.name} is "
                f"{gray.size[0]}x{gray.size[1]}; "
                "re-extract the video so all its frames have one size"
            )
        gray = gray.resize((size, size), Image.Resampling.BILINEAR)
        frames[i] = np.asarray(gray, dtype=np.float32) / np.float32(255.0)
    return frames


def _existing_root(root, dataset: str) -> Path:
    """``root`` as a Path, or a DataError naming the expected layout when it is no folder."""
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DataError(
            f"data folder '{root}' {what}: pass data_dir pointing at the extracted dataset "
            f"(expected {_EXPECTED_LAYOUT[dataset]})"
        )
    return root


def load_frame_folders(
    root: str | Path,
    *,
    dataset: str = "ucsd",
    size: int = 160,
    max_videos: int | None = None,
    max_frames: int | None = None,
    min_frames: int = 1,
) -> dict[str, list[np.ndarray]]:
    """Read train/test videos stored as folders of frames.

    Layouts (folder names matched case-insensitively; hidden entries, ``*_gt`` folders and
    non-image files are skipped; frames sorted in natural order, ``2.tif`` before ``10.tif``):

    * ``dataset="ucsd"``: ``root/UCSDped1|UCSDped2/Train/Train001/001.tif`` (every ``UCSDped*``
      folder found is read, in name order: point ``root`` at ``UCSDped2`` to read only Ped2), or
      ``root`` itself holding ``Train``/``Test``.
    * ``dataset="frames"``: ``root/{train,test}/<video>/<frame>.{tif,png,jpg,...}``; ``training``/
      ``testing`` and an extra ``frames/`` level (``training/frames/01/0000.jpg``) are accepted, as
      is one dataset folder in between (``root/avenue/training/...``).

    Each frame is converted to grayscale ``L``, resized to ``size x size`` (bilinear) and scaled by
    1/255. ``max_videos`` caps the videos per split, ``max_frames`` the frames per video (the first
    ones); a video with fewer than ``min_frames`` frames is refused (naming its folder).

    Returns:
        ``{"train": [[F, size, size] float32, ...], "test": [...]}``; a split without a folder is an
        empty list.
    """
    if dataset not in ("ucsd", "frames"):
        raise DataError(
            f"load_frame_folders reads dataset 'ucsd' or 'frames', got {dataset!r}: "
            "pass one of them"
        )
    root = _existing_root(root, dataset)
    splits = _split_dirs(root)
    if not splits["train"] and not splits["test"]:
        # One level down: UCSDped1/UCSDped2 (ucsd), or one dataset folder (frames).
        nested = [d for d in _visible_dirs(root) if any(_split_dirs(d).values())]
        if dataset == "ucsd":
            nested = [d for d in nested if d.name.lower().startswith("ucsdped")] or nested
        elif len(nested) > 1:
            names = ", ".join(d.name for d in nested)
            raise DataError(
                f"several datasets under '{root}' ({names}): point data_dir at one of them"
            )
        for d in nested:
            for split, dirs in _split_dirs(d).items():
                splits[split].extend(dirs)

    out: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for split, dirs in splits.items():
        videos = [v for d in dirs for v in _video_dirs(d)]
        if max_videos is not None:
            videos = videos[:max_videos]
        out[split] = [_read_video(v, size, max_frames, min_frames) for v in videos]
    if not out["train"] and not out["test"]:
        raise DataError(
            f"no video folders found under '{root}': expected {_EXPECTED_LAYOUT[dataset]}; "
            "extract the dataset in that layout or point data_dir at the right folder"
        )
    return out


# --------------------------------------------------------------------------------------------------
# Video files: CUHK Avenue, ShanghaiTech
# --------------------------------------------------------------------------------------------------


def _child_dir(folder: Path, *names: str) -> Path | None:
    """``folder/names[0]/names[1]/...`` matched case-insensitively among visible folders."""
    for name in names:
        match = [d for d in _visible_dirs(folder) if d.name.lower() == name]
        if not match:
            return None
        folder = match[0]
    return folder


def _dataset_root(root: Path, dataset: str, marker: tuple[str, ...]) -> Path | None:
    """``root`` if it holds ``marker`` (a folder path), else its one child that does."""
    if _child_dir(root, *marker) is not None:
        return root
    found = [d for d in _visible_dirs(root) if _child_dir(d, *marker) is not None]
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise DataError(
            f"several {dataset} datasets under '{root}' ({names}): point data_dir at one of them"
        )
    return found[0] if found else None


def _video_files(folder: Path) -> list[Path]:
    """The ``.avi`` files of ``folder`` in natural order; hidden (``.*``, ``._*``) and other
    files are skipped; none is an error naming what was there."""
    visible = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    files = sorted((p for p in visible if p.suffix.lower() == VIDEO_SUFFIX), key=_natural_key)
    if not files:
        others = sorted({p.suffix.lower() or p.name for p in visible})
        found = f", only {', '.join(others[:3])} files" if others else ""
        raise DataError(
            f"no {VIDEO_SUFFIX} videos in '{folder}' (hidden files skipped){found}: put the "
            "dataset's videos there or point data_dir at the extracted dataset"
        )
    return files


def _layout_error(root: Path, dataset: str) -> DataError:
    """No ``dataset`` layout under ``root``: name the folder expected, and a wrong dataset name."""
    hint = ""
    for other, marker in _VIDEO_MARKERS.items():
        candidates = [root, *_visible_dirs(root)]
        if other != dataset and any(_child_dir(d, *marker) for d in candidates):
            hint = f" (this looks like the {other} layout: pass dataset {other!r})"
    return DataError(
        f"no {'/'.join(_VIDEO_MARKERS[dataset])}/ folder under '{root}' or its subfolders{hint}: "
        f"expected the {dataset} layout {_EXPECTED_LAYOUT[dataset]}; point data_dir at the "
        "extracted dataset"
    )


def load_videos(
    root: str | Path,
    *,
    dataset: str = "ucsd",
    size: int = 160,
    max_videos: int | None = None,
    max_frames: int | None = None,
    min_frames: int = 1,
) -> dict[str, list[np.ndarray]]:
    """Train/test videos of a real dataset in the layout its archive extracts to.

    * ``"ucsd"``, ``"frames"``: :func:`load_frame_folders`.
    * ``"avenue"`` (CUHK Avenue): ``root/training_videos/01.avi ...`` and
      ``root/testing_videos/01.avi ...``; ``root`` may also be the folder holding
      ``Avenue Dataset/``. The ground truth beside them (``training_vol/``, ``testing_vol/``,
      ``testing_label_mask/``, ``ground_truth_demo/``) is ignored.
    * ``"shanghaitech"``: ``root/training/videos/01_001.avi ...`` and
      ``root/testing/frames/01_0014/000.jpg ...`` (one frame folder per test clip, frames in
      numeric order); ``root`` may also be the folder holding ``shanghaitech/``. The masks
      (``testing/test_frame_mask/``, ``testing/test_pixel_mask/``) are ignored.

    Folder names match case-insensitively; videos are read in natural name order; hidden files
    (``.DS_Store``, AppleDouble ``._01.avi``) and other non-video files are skipped. ``.avi`` files
    are decoded with PyAV (:func:`cudt.data.avi.read_avi`), frame folders as for UCSD; both give
    grayscale ``[F, size, size]`` float32 in ``[0, 1]``. ``max_videos`` caps the videos per split,
    ``max_frames`` the frames per video (the first ones); a video with fewer than ``min_frames``
    frames is refused.

    Returns:
        ``{"train": [[F, size, size], ...], "test": [...]}``.
    """
    if dataset not in DATASETS or dataset == "synthetic":
        raise DataError(
            f"load_videos reads a real dataset ({', '.join(DATASETS[1:])}), got {dataset!r}: "
            "pass one of them"
        )
    root = _existing_root(root, dataset)
    if dataset in ("ucsd", "frames"):
        return load_frame_folders(
            root,
            dataset=dataset,
            size=size,
            max_videos=max_videos,
            max_frames=max_frames,
            min_frames=min_frames,
        )
    from cudt.data.avi import read_avi  # PyAV loads only for the datasets stored as videos

    def cap(items: list[Path]) -> list[Path]:
        return items if max_videos is None else items[:max_videos]

    def avi(path: Path) -> np.ndarray:
        return read_avi(path, size=size, max_frames=max_frames, min_frames=min_frames)

    if dataset == "avenue":
        base = _dataset_root(root, dataset, _VIDEO_MARKERS[dataset])
        if base is None:
            raise _layout_error(root, dataset)
        test_dir = _child_dir(base, "testing_videos")
        if test_dir is None:
            raise DataError(
                f"no testing_videos/ folder beside '{_child_dir(base, 'training_videos')}': "
                f"extract the test videos there (expected {_EXPECTED_LAYOUT[dataset]})"
            )
        train_files = cap(_video_files(_child_dir(base, "training_videos")))
        test_files = cap(_video_files(test_dir))
        return {"train": [avi(p) for p in train_files], "test": [avi(p) for p in test_files]}

    base = _dataset_root(root, dataset, _VIDEO_MARKERS[dataset])
    if base is None:
        raise _layout_error(root, dataset)
    test_dir = _child_dir(base, "testing", "frames")
    if test_dir is None:
        raise DataError(
            f"no testing/frames/ folder in '{base}': extract the test clips' frame folders there "
            f"(expected {_EXPECTED_LAYOUT[dataset]})"
        )
    clips = cap(_visible_dirs(test_dir))
    if not clips:
        raise DataError(
            f"no test clip folders in '{test_dir}': extract the test clips there, one frame "
            "folder per clip (testing/frames/01_0014/000.jpg)"
        )
    train_files = cap(_video_files(_child_dir(base, "training", "videos")))
    return {
        "train": [avi(p) for p in train_files],
        "test": [_read_video(d, size, max_frames, min_frames) for d in clips],
    }


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
    x = frames.reshape(*lead, nh, patch, nw, patch)
    x = x.swapaxes(-3, -2)  # [..., nh, nw, p, p]
    return x.reshape(*lead, nh * nw, patch * patch)


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
    x = patches.reshape(*lead, nh, nw, patch, patch)
    x = x.swapaxes(-3, -2)  # [..., nh, p, nw, p]
    return x.reshape(*lead, height, width)


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
      ``num_videos``/``num_frames`` are not used.
    """
    if dataset not in DATASETS:
        raise DataError(f"unknown dataset {dataset!r}: valid names are {', '.join(DATASETS)}")
    if dataset == "synthetic":
        videos = synthetic_videos(num_videos, num_frames, size=size, seed=seed)
        train_v, val_v, test_v = split_videos(videos)
        source = f"synthetic(num_videos={num_videos}, num_frames={num_frames}, seed={seed})"
    else:
        if data_dir is None:
            raise DataError(
                f"dataset {dataset!r} needs data_dir: pass the folder holding the videos "
                f"(expected {_EXPECTED_LAYOUT[dataset]})"
            )
        try:
            folders = load_videos(
                data_dir,
                dataset=dataset,
                size=size,
                max_videos=max_videos,
                max_frames=max_frames,
                min_frames=seq_len,
            )
        except OSError as e:  # e.g. a folder or frame the user may not read
            raise DataError(
                f"cannot read '{e.filename or data_dir}' ({e.strerror or e}): check that data_dir "
                "and its files are readable"
            ) from e
        train_v, test_v = folders["train"], folders["test"]
        if not train_v:
            raise DataError(
                f"no training videos under '{data_dir}': add a Train/ (or train/) folder of "
                "video folders"
            )
        if not test_v:
            raise DataError(
                f"need at least 1 test video under '{data_dir}', found 0: add test videos "
                f"(expected {_EXPECTED_LAYOUT[dataset]})"
            )
        train_v, val_v = split_train_val(train_v, seq_len)
        source = f"{dataset}:{data_dir}"
    train = make_sequences(train_v, seq_len, stride=stride, patch=patch)
    val = make_sequences(val_v, seq_len, stride=stride, patch=patch)
    test = make_sequences(test_v, seq_len, stride=stride, patch=patch)
    frames = None
    if keep_frames:
        frames = {
            name: np.concatenate([np.asarray(v, np.float32) for v in videos])
            for name, videos in (("train", train_v), ("val", val_v), ("test", test_v))
        }
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
