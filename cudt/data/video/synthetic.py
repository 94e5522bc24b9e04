"""The synthetic surveillance-video generator: procedural clips standing in for real footage.

A textured static background (walkway, fixed structures, fine texture), moving occluding objects
(pedestrians, vehicles) with shadows, and a slow sub-pixel camera drift; see
:func:`synthetic_videos`. Frames are float32 in ``[0, 1]``, no noise added.
"""

from __future__ import annotations

import math

import numpy as np

from cudt.errors import DataError

__all__ = ["synthetic_videos"]


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
