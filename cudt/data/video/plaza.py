"""The plaza generator: a second video source for held-out checks, never used to choose anything.

A fixed camera on a pole looks down on a paved plaza in front of a building, in perspective: the
same scene in kind as CUHK Avenue or ShanghaiTech, and unlike :mod:`cudt.data.video.synthetic`
(a top-down texture with sprites of fixed size) in every statistic that matters to a denoiser:

* **perspective**: a ground plane seen from 4-9 m up, so paving tiles and people shrink with
  distance, the ground's texture gets finer towards the horizon, and a building facade (windows,
  storefront, cornices) or sky fills the top of the frame;
* **a procedural ground texture in world coordinates**: running-bond or square paving with
  mortar joints, per-tile tone, stains and grain, a path of other paving across the plaza;
  filtered by each pixel's footprint on the ground, so distant paving blurs instead of aliasing;
* **light that moves**: a sun whose cast shadows (of people and props) fall on the ground, cloud
  shadows drifting with the wind (they also dim the sun on people and facade), a slow auto-
  exposure drift, vignetting and a gamma curve;
* **articulated people**: torso, head, two legs and two arms swinging with the gait (the phase
  follows the distance walked), seen from the side or the front by their heading, walking
  between random waypoints on the ground (turning, entering and leaving the view) or standing;
  drawn far to near with lamp posts, bollards and planters;
* **a camera**: sub-pixel shake (an AR(1) jitter, every frame) and sensor noise (read noise plus
  shot noise that grows with the signal), at 320x180 and 15 frames per second by default.

:func:`plaza_videos` returns the frames; :func:`write_plaza` writes them in the CUHK Avenue or
ShanghaiTech layout (:mod:`cudt.data.video.archives`: MPEG-4 ``.avi`` and JPEG frame folders),
read back by ``--dataset avenue`` / ``--dataset shanghaitech``. ``python -m
experiments.held_out_data plaza DIR`` does the same from the command line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cudt.data.video.archives import LazyVideos, write_avenue, write_shanghaitech
from cudt.errors import DataError

__all__ = ["LAYOUTS", "plaza_videos", "write_plaza"]

LAYOUTS = ("avenue", "shanghaitech")
_TAG = 0x504C415A  # "PLAZ": every stream of this generator is apart from synthetic.py's


# --------------------------------------------------------------------------------------------------
# Procedural functions of world coordinates
# --------------------------------------------------------------------------------------------------


def _hash01(i: np.ndarray, j: np.ndarray, salt: int) -> np.ndarray:
    """A value in [0, 1) per integer cell ``(i, j)``: a stateless hash (any cell, any order)."""
    with np.errstate(over="ignore"):
        h = i.astype(np.int64).astype(np.uint64) * np.uint64(73856093)
        h ^= j.astype(np.int64).astype(np.uint64) * np.uint64(19349663)
        h ^= np.uint64(salt)
        h ^= h >> np.uint64(13)
        h *= np.uint64(1274126177)
        h ^= h >> np.uint64(16)
    return (h & np.uint64(0xFFFF)).astype(np.float64) / 65536.0


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


class _Noise:
    """Periodic lattice value noise: ``noise(x, y)`` at any points (grid units), about unit std."""

    def __init__(self, rng: np.random.Generator, n: int = 32):
        self.grid = rng.normal(size=(n, n))
        self.n = n

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x0, y0 = np.floor(x), np.floor(y)
        fx, fy = _smoothstep(x - x0), _smoothstep(y - y0)
        i0, j0 = x0.astype(np.int64) % self.n, y0.astype(np.int64) % self.n
        i1, j1 = (i0 + 1) % self.n, (j0 + 1) % self.n
        g = self.grid
        top = g[j0, i0] * (1 - fx) + g[j0, i1] * fx
        bottom = g[j1, i0] * (1 - fx) + g[j1, i1] * fx
        return top * (1 - fy) + bottom * fy


def _fade(footprint: np.ndarray, period: float) -> np.ndarray:
    """How much of a pattern of ``period`` metres survives a pixel footprint (1 sharp, 0 gone)."""
    return 1.0 - _smoothstep((footprint / period - 0.25) / 0.75)


def _paving(a, b, fp, tile_a, tile_b, joint, bond, salt):
    """Tiles of ``tile_a x tile_b`` metres along rotated ground axes ``(a, b)``; returns the joint
    coverage and a per-tile tone in [-0.5, 0.5], both faded by the footprint ``fp``."""
    row = np.floor(b / tile_b)
    col_pos = a / tile_a + bond * 0.5 * (row % 2)
    col = np.floor(col_pos)
    fa, fb = col_pos - col, b / tile_b - row
    edge = np.minimum(np.minimum(fa, 1 - fa) * tile_a, np.minimum(fb, 1 - fb) * tile_b)
    sharp = np.clip(0.5 + (joint - edge) / np.maximum(fp, 1e-6), 0.0, 1.0)
    mean = 1.0 - (1.0 - 2 * joint / tile_a) * (1.0 - 2 * joint / tile_b)
    keep = _fade(fp, min(tile_a, tile_b))
    lines = keep * sharp + (1 - keep) * mean
    tone = (_hash01(col, row, salt) - 0.5) * keep
    return lines, tone


# --------------------------------------------------------------------------------------------------
# The scene of one video
# --------------------------------------------------------------------------------------------------


def _scene(rng: np.random.Generator, height: int, width: int) -> dict:
    """Camera, plaza, facade, light and props of one video (all its draws but the people's)."""
    f = width * rng.uniform(0.75, 1.1)  # focal length in pixels (a 49-68 degree field of view)
    cam_h = rng.uniform(4.0, 9.0)  # metres above the ground
    horizon = height * rng.uniform(-0.45, 0.05)  # image row of the horizon (above the frame)
    wall_row = height * rng.uniform(0.12, 0.4)  # where the ground meets the facade
    s = {
        "f": f,
        "cx": width / 2 + rng.uniform(-0.05, 0.05) * width,
        "cam_h": cam_h,
        "horizon": horizon,
        "wall_row": wall_row,
        "z_wall": f * cam_h / (wall_row - horizon),
        "building_h": rng.uniform(7.0, 30.0),
        # ground paving, along axes rotated by theta
        "theta": rng.uniform(0, np.pi / 2) if rng.random() < 0.5 else 0.0,
        "tile": (rng.uniform(0.3, 0.9), rng.uniform(0.2, 0.6)),
        "bond": float(rng.random() < 0.6),
        "joint": rng.uniform(0.008, 0.025),
        "ground": rng.uniform(0.25, 0.6),
        "mortar": rng.uniform(0.1, 0.7),
        "tile_amp": rng.uniform(0.05, 0.3),
        "stain_amp": rng.uniform(0.05, 0.2),
        "stain_cell": rng.uniform(1.0, 4.0),
        "grain_amp": rng.uniform(0.04, 0.12),
        # a path of other paving across the plaza
        "path_dir": rng.uniform(0, np.pi),
        "path_off": rng.uniform(-0.5, 0.5),
        "path_w": rng.uniform(1.0, 3.0),
        "path_tile": rng.uniform(0.15, 0.35),
        "path_tone": rng.uniform(0.2, 0.75),
        # facade
        "facade": rng.uniform(0.2, 0.75),
        "bay": rng.uniform(2.5, 4.5),
        "storey": rng.uniform(3.0, 3.8),
        "window": (rng.uniform(0.35, 0.7), rng.uniform(0.35, 0.6)),
        "glass": rng.uniform(0.03, 0.2),
        "ground_floor": rng.uniform(3.5, 5.0),
        "sky": rng.uniform(0.7, 0.95),
        # light: sun (its azimuth on the ground, shadow length per metre of height), clouds
        "sun": rng.uniform(0, 2 * np.pi),
        "shadow_len": rng.uniform(0.4, 1.8),
        "direct": rng.uniform(0.35, 0.7),
        "cloud_amount": rng.uniform(0.0, 0.8) if rng.random() < 0.8 else 0.0,
        "cloud_cell": rng.uniform(8.0, 30.0),
        "cloud_cut": rng.uniform(-0.5, 0.5),
        "wind": rng.uniform(1.0, 5.0)
        * np.array([np.cos(a := rng.uniform(0, 2 * np.pi)), np.sin(a)]),
        # camera: exposure drift, vignette, gamma, noise, shake
        "exposure": rng.uniform(0.9, 1.25),
        "drift_amp": rng.uniform(0.02, 0.1),
        "drift_period": rng.uniform(3.0, 12.0),  # seconds
        "drift_phase": rng.uniform(0, 2 * np.pi),
        "vignette": rng.uniform(0.1, 0.35),
        "gamma": rng.uniform(1.8, 2.4),
        "read_noise": rng.uniform(0.003, 0.008),
        "shot_noise": rng.uniform(5e-5, 2e-4),
        "shake": rng.uniform(0.05, 0.35),  # pixels, innovation of the AR(1) jitter
    }
    s["noise_stain"], s["noise_grain"], s["noise_cloud"] = (_Noise(rng) for _ in range(3))
    s["salt"] = int(rng.integers(1 << 30))
    s["props"] = [_make_prop(rng, s, height, width) for _ in range(int(rng.integers(2, 7)))]
    return s


def _ground_row(s: dict, z):
    return s["horizon"] + s["f"] * s["cam_h"] / z


def _depth_of_row(s: dict, row):
    return s["f"] * s["cam_h"] / (row - s["horizon"])


def _half_view(s: dict, z, width: int, margin_px: float = 0.0):
    """Half the width (metres) of the ground seen at depth ``z``, plus ``margin_px`` pixels."""
    return (width / 2 + margin_px) * z / s["f"]


def _random_ground_point(rng, s, height, width, *, visible=False):
    """A point of the plaza: uniform in image row (so near and far are alike), out to 40 pixels
    past the sides and a quarter frame below the bottom unless ``visible``."""
    lo = s["wall_row"] + 3
    hi = height - 4 if visible else 1.25 * height
    z = _depth_of_row(s, rng.uniform(lo, hi))
    x = rng.uniform(-1, 1) * _half_view(s, z, width, 0 if visible else 40)
    return np.array([x + (s["cx"] - width / 2) * z / s["f"], z])


def _make_prop(rng, s, height, width) -> dict:
    kind = ["pole", "bollard", "planter"][int(rng.choice(3, p=[0.35, 0.35, 0.3]))]
    x, z = _random_ground_point(rng, s, height, width, visible=True)
    value = rng.uniform(0.08, 0.7)
    if kind == "pole":
        h, r = rng.uniform(3.5, 5.5), rng.uniform(0.05, 0.09)
        parts = [
            ("capsule", (0, 0, 0, h, r), value),
            ("box", (-0.25, h - 0.1, 0.25, h + 0.12), 0.9),
        ]
        half = r
    elif kind == "bollard":
        h, r = rng.uniform(0.7, 1.1), rng.uniform(0.08, 0.14)
        parts = [("capsule", (0, r, 0, h - r, r), value)]
        half = r
    else:
        w, h = rng.uniform(0.5, 1.0), rng.uniform(0.5, 0.9)
        bush = rng.uniform(0.08, 0.3)
        parts = [
            ("box", (-w, 0, w, h), value),
            ("capsule", (-0.6 * w, h + 0.3 * w, 0.6 * w, h + 0.3 * w, 0.45 * w), bush),
        ]
        half, h = w, h + 0.75 * w
    return {"x": x, "z": z, "parts": parts, "shadow": (h, half)}


# --------------------------------------------------------------------------------------------------
# People
# --------------------------------------------------------------------------------------------------


def _make_person(rng, s, height, width, duration: float, visible: bool) -> dict:
    """One person and their path over ``duration`` seconds (every draw from their own stream,
    attributes first, so a longer clip extends the same path)."""
    p = {
        "h": float(np.clip(rng.normal(1.72, 0.09), 1.45, 1.98)),
        "build": rng.uniform(0.85, 1.2),
        "top": rng.uniform(0.04, 0.85),
        "bottom": rng.uniform(0.04, 0.6),
        "hair": rng.uniform(0.03, 0.35),
        "skin": rng.uniform(0.25, 0.65),
        "bag": rng.uniform(0.05, 0.6) if rng.random() < 0.3 else None,
        "phase0": rng.uniform(0, 2 * np.pi),
    }
    standing = rng.random() < 0.15
    p["speed"] = 0.0 if standing else rng.uniform(0.8, 1.8)
    start = _random_ground_point(rng, s, height, width, visible=visible)
    if standing:
        p["facing"] = rng.uniform(0, 2 * np.pi)
        p["points"], p["cum"] = start[None], np.zeros(1)
        return p
    points, cum = [start], [0.0]
    need = p["speed"] * duration + 1.0
    while cum[-1] < need:
        nxt = _random_ground_point(rng, s, height, width)
        cum.append(cum[-1] + float(np.hypot(*(nxt - points[-1]))))
        points.append(nxt)
    p["points"], p["cum"] = np.array(points), np.array(cum)
    return p


def _person_at(p: dict, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ground position ``[F, 2]``, unit heading ``[F, 2]`` and gait phase ``[F]`` at times ``t``."""
    if p["speed"] == 0:
        pos = np.repeat(p["points"], len(t), axis=0)
        heading = np.tile([np.cos(p["facing"]), np.sin(p["facing"])], (len(t), 1))
        return pos, heading, np.full(len(t), p["phase0"])
    dist = p["speed"] * t
    pos = np.stack([np.interp(dist, p["cum"], p["points"][:, k]) for k in (0, 1)], axis=1)
    seg = np.clip(np.searchsorted(p["cum"], dist, side="right") - 1, 0, len(p["cum"]) - 2)
    step = p["points"][seg + 1] - p["points"][seg]
    heading = step / np.maximum(np.linalg.norm(step, axis=1, keepdims=True), 1e-9)
    stride = 0.8 * p["h"]  # two steps
    return pos, heading, p["phase0"] + 2 * np.pi * dist / stride


def _person_parts(p: dict, heading: np.ndarray, phase: float) -> list:
    """Body parts in metres (x to the image's right, y up from the feet), back to front."""
    h, walk = p["h"], p["speed"] > 0
    side, front = float(heading[0]), abs(float(heading[1]))  # seen from the side / the front
    bob = 0.012 * h * abs(np.cos(phase)) if walk else 0.0
    hip, shoulder = 0.52 * h + bob, 0.81 * h + bob
    torso_r = h * (0.07 + 0.045 * front) * p["build"]
    leg_amp = (0.25 + 0.12 * p["speed"]) if walk else 0.0
    parts = []
    for sign in (1.0, -1.0):  # legs swing in turn, arms against them
        a = sign * leg_amp * np.sin(phase)
        hx = sign * 0.05 * h * front
        foot = (hx + 0.5 * h * np.sin(a) * side, hip - 0.5 * h * np.cos(a))
        parts.append(("capsule", (hx, hip, *foot, 0.045 * h * p["build"]), p["bottom"]))
    arms = []
    for sign in (1.0, -1.0):
        b = -sign * 0.6 * leg_amp * np.sin(phase)
        sx = sign * torso_r * (0.3 + 0.7 * front)
        hand = (sx + 0.36 * h * np.sin(b) * side, shoulder - 0.03 * h - 0.36 * h * np.cos(b))
        arms.append(("capsule", (sx, shoulder - 0.03 * h, *hand, 0.028 * h), p["top"]))
    parts.append(arms[0])
    parts.append(("capsule", (0, hip + 0.02 * h, 0, shoulder - 0.02 * h, torso_r), p["top"]))
    if p["bag"] is not None:
        bx = torso_r * 0.9 * (1 if side >= 0 else -1)
        parts.append(("box", (bx - 0.06 * h, hip, bx + 0.06 * h, hip + 0.12 * h), p["bag"]))
    parts.append(arms[1])
    face = float(np.clip(0.5 - 1.5 * heading[1], 0.0, 1.0))  # walking towards the camera
    head = p["hair"] + (p["skin"] - p["hair"]) * face
    parts.append(("capsule", (0, 0.925 * h + bob, 0, 0.925 * h + bob, 0.068 * h), head))
    return parts


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def _sprite(parts, u: float, v: float, scale: float, height: int, width: int):
    """Coverage and albedo of an object whose feet are at pixel ``(u, v)``, ``scale`` pixels per
    metre; ``(rows, cols, coverage, albedo)`` over its bounding box in the frame, or None."""
    xs = [c for _, g, _ in parts for c in (g[0], g[2])]  # both kinds: (x0, y0, x1, y1, ...)
    ys = [c for _, g, _ in parts for c in (g[1], g[3])]
    pad = max(g[4] if kind == "capsule" else 0.0 for kind, g, _ in parts)
    x0 = int(math.floor(u + scale * (min(xs) - pad))) - 1
    x1 = int(math.ceil(u + scale * (max(xs) + pad))) + 2
    y0 = int(math.floor(v - scale * (max(ys) + pad))) - 1
    y1 = int(math.ceil(v - scale * (min(ys) - pad))) + 2
    x0, x1, y0, y1 = max(x0, 0), min(x1, width), max(y0, 0), min(y1, height)
    if x0 >= x1 or y0 >= y1:
        return None
    px = (np.arange(x0, x1) - u)[None, :] / scale  # metres
    py = (v - np.arange(y0, y1))[:, None] / scale
    cover = np.zeros((y1 - y0, x1 - x0))
    albedo = np.zeros_like(cover)
    for kind, g, value in parts:
        if kind == "capsule":
            ax, ay, bx, by, r = g
            dx, dy = bx - ax, by - ay
            t = np.clip(((px - ax) * dx + (py - ay) * dy) / max(dx * dx + dy * dy, 1e-12), 0, 1)
            dist = np.hypot(px - ax - t * dx, py - ay - t * dy) - r
        else:
            cx, cy = (g[0] + g[2]) / 2, (g[1] + g[3]) / 2
            qx, qy = np.abs(px - cx) - (g[2] - g[0]) / 2, np.abs(py - cy) - (g[3] - g[1]) / 2
            dist = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0)) + np.minimum(
                np.maximum(qx, qy), 0
            )
        c = np.clip(0.5 - dist * scale, 0.0, 1.0)  # antialiased over one pixel
        albedo += c * (value - albedo)
        cover += c * (1 - cover)
    return slice(y0, y1), slice(x0, x1), cover, albedo


def _ground_albedo(s: dict, x: np.ndarray, z: np.ndarray, fp: np.ndarray) -> np.ndarray:
    ct, st = np.cos(s["theta"]), np.sin(s["theta"])
    a, b = x * ct + z * st, -x * st + z * ct
    lines, tone = _paving(a, b, fp, *s["tile"], s["joint"], s["bond"], s["salt"])
    stain = s["noise_stain"](x / s["stain_cell"], z / s["stain_cell"]) * _fade(fp, s["stain_cell"])
    grain = s["noise_grain"](x / 0.06, z / 0.06) * _fade(fp, 0.06)
    base = s["ground"] * (1 + s["tile_amp"] * tone + s["stain_amp"] * stain)
    albedo = base * (1 - lines) + s["mortar"] * s["ground"] * lines
    # the path: square setts of another tone across the plaza
    pd = s["path_dir"]
    across = -x * np.sin(pd) + (z - s["z_wall"] / 2) * np.cos(pd) - s["path_off"] * s["z_wall"] / 2
    inside = np.clip(0.5 + (s["path_w"] - np.abs(across)) / np.maximum(fp, 1e-6), 0.0, 1.0)
    along = x * np.cos(pd) + z * np.sin(pd)
    p_lines, p_tone = _paving(
        along, across, fp, s["path_tile"], s["path_tile"], 0.01, 0.0, ~s["salt"] & 0x3FFFFFFF
    )
    path = s["path_tone"] * (1 + 0.3 * p_tone) * (1 - 0.5 * p_lines)
    albedo = albedo * (1 - inside) + path * inside
    return albedo * (1 + s["grain_amp"] * grain)


def _facade_albedo(s: dict, x: np.ndarray, y: np.ndarray, fp: float) -> np.ndarray:
    """The building: bays of windows per storey above a glazed ground floor, cornices."""
    col = x / s["bay"]
    ci = np.floor(col)
    fc = col - ci
    upper = y - s["ground_floor"]
    fi = np.floor(upper / s["storey"])
    ff = upper / s["storey"] - fi
    ww, wh = s["window"]
    soft = lambda d: np.clip(0.5 + d / fp, 0.0, 1.0)  # noqa: E731 (d metres inside the edge)
    win = np.minimum(
        soft((ww / 2 - np.abs(fc - 0.5)) * s["bay"]),
        soft((wh / 2 - np.abs(ff - 0.5)) * s["storey"]),
    )
    win = win * (upper > 0)
    glass = s["glass"] * (1 + 2.5 * _hash01(ci, fi, s["salt"] + 7))  # lit and dark windows
    cornice = soft(0.12 - np.abs(ff) * s["storey"]) * (upper > 0)
    store = np.minimum(
        soft((0.42 - np.abs(fc - 0.5)) * s["bay"]),
        soft(np.minimum(y - 0.3, s["ground_floor"] - 0.6 - y)),
    )
    albedo = s["facade"] * (1 + 0.3 * cornice)
    albedo = albedo * (1 - win) + glass * win
    return albedo * (1 - store) + 0.6 * s["glass"] * store


def _shadow(s, gx, gz, fp, rows, cols, x, z, length, half):
    """Add (max) the cast shadow of an object at ground ``(x, z)`` into the view ``rows, cols``
    of the frame's shadow map; the shadow is a capsule ``length`` long along the sun."""
    d = np.array([np.cos(s["sun"]), np.sin(s["sun"])])
    rx, rz = gx[rows, cols] - x, gz[rows, cols] - z
    along = rx * d[0] + rz * d[1]
    t = np.clip(along, 0.0, length)
    dist = np.hypot(rx - t * d[0], rz - t * d[1]) - half
    pen = 0.02 * length + 0.02
    return np.clip(0.5 - dist / np.maximum(fp[rows, cols], pen), 0.0, 1.0)


def _shadow_box(s, x, z, length, half, height, width, jitter):
    """Rows and columns of the frame that can hold the shadow (None when none can)."""
    d = np.array([np.cos(s["sun"]), np.sin(s["sun"])])
    ends = np.array([[x, z], [x + length * d[0], z + length * d[1]]])
    lo, hi = ends.min(0) - half - 0.3, ends.max(0) + half + 0.3
    z_lo = max(lo[1], _depth_of_row(s, 3.0 * height))
    z_hi = min(hi[1], s["z_wall"])
    if z_lo >= z_hi:
        return None
    r0 = int(math.floor(_ground_row(s, z_hi) - jitter[1])) - 1
    r1 = int(math.ceil(_ground_row(s, z_lo) - jitter[1])) + 2
    us = [s["cx"] + s["f"] * xx / zz - jitter[0] for xx in (lo[0], hi[0]) for zz in (z_lo, z_hi)]
    c0, c1 = int(math.floor(min(us))) - 1, int(math.ceil(max(us))) + 2
    r0, r1, c0, c1 = max(r0, 0), min(r1, height), max(c0, 0), min(c1, width)
    if r0 >= r1 or c0 >= c1:
        return None
    return slice(r0, r1), slice(c0, c1)


def _cloud_light(s: dict, x, z, t: float):
    """The share of the sun that reaches ground (or facade) point ``(x, z)`` at time ``t``:
    cloud shadows are a noise field drifting with the wind."""
    if s["cloud_amount"] == 0:
        return np.ones_like(x)
    wind, cell = s["wind"], s["cloud_cell"]
    c = s["noise_cloud"]((x - wind[0] * t) / cell, (z - wind[1] * t) / cell)
    return 1.0 - s["cloud_amount"] * _smoothstep((c - s["cloud_cut"]) / 0.6 + 0.5)


def _render_video(seed: int, video: int, num_frames: int, height: int, width: int, fps: int):
    rng = np.random.default_rng([seed, video, _TAG])
    s = _scene(rng, height, width)
    duration = num_frames / fps
    people = [
        _make_person(
            np.random.default_rng([seed, video, _TAG, 1, k]), s, height, width, duration, k < 2
        )
        for k in range(int(rng.integers(3, 15)))
    ]
    t = np.arange(num_frames) / fps
    tracks = [_person_at(p, t) for p in people]
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    r2 = ((xx - width / 2) ** 2 + (yy - height / 2) ** 2) / ((width / 2) ** 2 + (height / 2) ** 2)
    vignette = 1.0 - s["vignette"] * r2
    shadow_dir = np.array([np.cos(s["sun"]), np.sin(s["sun"])])
    jitter = np.zeros(2)
    out = np.empty((num_frames, height, width), np.float32)
    for fi in range(num_frames):
        frame_rng = np.random.default_rng([seed, video, _TAG, 2, fi])
        innovation = frame_rng.normal(size=2) * s["shake"]
        jitter = innovation / math.sqrt(1 - 0.85**2) if fi == 0 else 0.85 * jitter + innovation
        # The scene point seen by pixel (x, y) is the one at (x + jx, y + jy) of the still camera.
        sx, sy = xx + jitter[0], yy + jitter[1]
        tt = t[fi]

        ground = sy > s["wall_row"]
        gz = _depth_of_row(s, np.where(ground, sy, s["wall_row"] + 1.0))
        gx = (sx - s["cx"]) * gz / s["f"]
        fp = gz * gz / (s["f"] * s["cam_h"]) + gz / s["f"]  # metres of ground under a pixel
        shade = np.zeros((height, width))
        casters = [
            (pr["x"], pr["z"], pr["shadow"][0] * s["shadow_len"], pr["shadow"][1])
            for pr in s["props"]
        ]
        for p, (pos, _, phase) in zip(people, tracks, strict=True):
            stretch = 1.0 + 0.4 * abs(np.sin(phase[fi])) * (p["speed"] > 0)
            casters.append(
                (pos[fi, 0], pos[fi, 1], p["h"] * s["shadow_len"], 0.15 * stretch * p["build"])
            )
        for x, z, length, half in casters:
            box = _shadow_box(s, x, z, length, half, height, width, jitter)
            if box is not None:
                shade[box] = np.maximum(
                    shade[box], _shadow(s, gx, gz, fp, *box, x, z, length, half)
                )
        ambient = 1.0 - s["direct"]
        light_g = ambient + s["direct"] * _cloud_light(s, gx, gz, tt) * (1 - shade)
        radiance = _ground_albedo(s, gx, gz, fp) * light_g
        # the facade and, above it, the sky
        fy = s["cam_h"] + (s["horizon"] - sy) * s["z_wall"] / s["f"]  # metres above the ground
        fx = (sx - s["cx"]) * s["z_wall"] / s["f"]
        fp_wall = s["z_wall"] / s["f"]
        light_f = ambient + s["direct"] * _cloud_light(s, fx, s["z_wall"] + fy, tt)
        wall = _facade_albedo(s, fx, fy, fp_wall) * light_f
        sky = s["sky"] * (0.9 + 0.1 * np.clip(sy / height, 0, 1))
        top = np.clip(0.5 + (s["building_h"] - fy) / fp_wall, 0.0, 1.0)
        wall = wall * top + sky * (1 - top)
        on_ground = np.clip(sy - s["wall_row"] + 0.5, 0.0, 1.0)
        radiance = radiance * on_ground + wall * (1 - on_ground)
        # people and props, far to near
        objects = [(pr["z"], pr["x"], pr["parts"]) for pr in s["props"]]
        for p, (pos, heading, phase) in zip(people, tracks, strict=True):
            objects.append((pos[fi, 1], pos[fi, 0], _person_parts(p, heading[fi], phase[fi])))
        for z, x, parts in sorted(objects, key=lambda o: -o[0]):
            if z <= 0.3:
                continue
            u = s["cx"] + s["f"] * x / z - jitter[0]
            v = _ground_row(s, z) - jitter[1]
            scale = s["f"] / z
            drawn = _sprite(parts, u, v, scale, height, width)
            if drawn is None:
                continue
            rows, cols, cover, albedo = drawn
            lit = float(_cloud_light(s, np.array(x), np.array(z), tt))
            across = (np.arange(cols.start, cols.stop) - u) / (0.25 * scale)
            # the side facing the sun (opposite to where shadows fall) is brighter
            side = 0.8 + 0.2 * np.clip(-across * shadow_dir[0], -1, 1)
            light = ambient + s["direct"] * lit * side[None, :]
            region = radiance[rows, cols]
            radiance[rows, cols] = region + cover * (albedo * light - region)
        # the camera: exposure drift, vignette, gamma, sensor noise
        gain = s["exposure"] * (
            1 + s["drift_amp"] * np.sin(2 * np.pi * tt / s["drift_period"] + s["drift_phase"])
        )
        value = np.clip(radiance * gain * vignette, 0.0, 1.0) ** (1.0 / s["gamma"])
        sigma = np.sqrt(s["read_noise"] ** 2 + s["shot_noise"] * value)
        value = value + sigma * frame_rng.normal(size=value.shape)
        out[fi] = np.clip(value, 0.0, 1.0)
    return out


def _check_sizes(num_videos: int, num_frames: int, height: int, width: int, fps: int) -> None:
    if num_videos < 1 or num_frames < 1:
        raise DataError(
            f"plaza_videos needs num_videos >= 1 and num_frames >= 1, got {num_videos} and "
            f"{num_frames}: pass positive counts"
        )
    if height < 32 or width < 32 or height % 2 or width % 2:
        raise DataError(
            f"plaza frames must be even sizes of at least 32 pixels (the .avi encoder's "
            f"yuv420p halves them), got {width}x{height}: pass e.g. 320x180"
        )
    if not 1 <= fps <= 120:
        raise DataError(f"plaza fps must be a whole number in [1, 120], got {fps}: pass e.g. 15")


def _check_seed(seed: int) -> None:
    if seed < 0:
        raise DataError(f"plaza_videos needs seed >= 0, got {seed}: pass a non-negative seed")


def plaza_videos(
    num_videos: int,
    num_frames: int,
    *,
    height: int = 180,
    width: int = 320,
    fps: int = 15,
    seed: int = 0,
) -> np.ndarray:
    """Clips of a camera over a plaza (see the module docstring), deterministic in the seed.

    Video ``v`` depends only on ``(seed, v, height, width, fps)``: it is the same whatever
    ``num_videos`` is, and a shorter ``num_frames`` gives a prefix of a longer one.

    Returns:
        ``[V, F, height, width]`` float32 in ``[0, 1]``, sensor noise included.
    """
    _check_sizes(num_videos, num_frames, height, width, fps)
    _check_seed(seed)
    return np.stack(
        [_render_video(seed, v, num_frames, height, width, fps) for v in range(num_videos)]
    )


def write_plaza(
    root: str | Path,
    *,
    layout: str = "avenue",
    train_videos: int = 9,
    test_videos: int = 3,
    num_frames: int = 48,
    seed: int = 0,
    height: int = 180,
    width: int = 320,
    fps: int = 15,
) -> Path:
    """Plaza clips in the CUHK Avenue (``root/Avenue Dataset/training_videos/01.avi``) or
    ShanghaiTech (``root/shanghaitech/training/videos/01_001.avi``, ``02_001.avi``, ...: a
    scene each; test clips as JPEG frame folders) layout, ``.avi`` files at ``fps`` frames per
    second; returns the dataset folder (a ``--data-dir`` for ``--dataset avenue`` /
    ``--dataset shanghaitech``). Training videos
    are videos ``0 .. train_videos - 1`` of :func:`plaza_videos`, test videos the next ones,
    each made as it is written (one video in memory at a time, not the whole set).
    Written by :mod:`cudt.data.video.archives`' writers as a copied archive holds them: with
    the ground-truth placeholders and the macOS/Windows litter the readers must skip."""
    if layout not in LAYOUTS:
        raise DataError(f"unknown plaza layout {layout!r}: choose from {', '.join(LAYOUTS)}")
    if train_videos < 1 or test_videos < 1:
        raise DataError(
            f"write_plaza needs at least one training and one test video, got {train_videos} "
            f"and {test_videos}: pass positive counts"
        )
    _check_sizes(train_videos + test_videos, num_frames, height, width, fps)
    _check_seed(seed)

    def video(v: int) -> np.ndarray:  # plaza_videos(...)[v], made alone
        return _render_video(seed, v, num_frames, height, width, fps)

    # one video in memory at a time, made as it is written: the whole set may not fit
    split = {
        "train": LazyVideos(train_videos, video),
        "test": LazyVideos(test_videos, lambda i: video(train_videos + i)),
    }
    if layout == "avenue":
        return write_avenue(root, split, rate=fps)
    # every plaza video is a scene of its own (_render_video draws one per video): named as
    # two clips of one camera, the reader held out one of each pair for validation (4 of 9)
    return write_shanghaitech(root, split, rate=fps, clips_per_scene=1)
