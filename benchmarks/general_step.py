"""The general constrained step vs cudt.make_train_step on the same descent problem.

    python -m benchmarks.general_step [--steps 200] [--width 256] [--layers 6] [--batch 256]

Both steps are compiled first, then timed in interleaved rounds (A, B, A, B, ...) so machine
noise hits both alike; prints the median time per step of each and the ratio general / descent
(goal: <= 1.0).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import cudt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()

    k = jax.random.split(jax.random.key(0), a.layers + 3)
    params = {
        "w": [jax.random.normal(k[i], (a.width, a.width)) / a.width**0.5 for i in range(a.layers)],
        "out": jax.random.normal(k[-3], (a.width, 8)) / a.width**0.5,
    }
    batch = (jax.random.normal(k[-2], (a.batch, a.width)), jax.random.normal(k[-1], (a.batch, 8)))
    eps = 0.05

    def layer_losses(p, b, key):
        x, y = b
        cols, h = [], x
        for w in p["w"]:
            cols.append(jnp.mean((h @ p["out"] - y) ** 2, axis=-1))
            h = h + jnp.tanh(h @ w)
        cols.append(jnp.mean((h @ p["out"] - y) ** 2, axis=-1))
        return jnp.stack(cols, axis=1)

    def problem(p, b, key):
        m = jnp.mean(layer_losses(p, b, key), axis=0)
        return m[-1], {"descent": cudt.Constraint(m[1:] - (1 - eps) * m[:-1])}

    cfg = cudt.DescentConfig(num_layers=a.layers, epsilon=eps)
    init_a, step_a = cudt.make_train_step(
        layer_losses, optax.adam(1e-3), cudt.dual_ascent(1e-2), cfg
    )
    init_b, step_b = cudt.make_constrained_step(
        problem, primal=optax.adam(1e-3), dual=cudt.dual_ascent(1e-2)
    )
    key = jax.random.key(1)
    states = {"make_train_step": init_a(params), "make_constrained_step": init_b(params, batch)}
    steps = {"make_train_step": step_a, "make_constrained_step": step_b}
    for name in states:  # compile
        states[name], m = steps[name](states[name], batch, key)
        jax.block_until_ready(states[name])
    times = {n: [] for n in states}
    for _ in range(a.rounds):
        for name in states:
            s = states[name]
            t0 = time.perf_counter()
            for _ in range(a.steps):
                s, _ = steps[name](s, batch, key)
            jax.block_until_ready(s)
            times[name].append((time.perf_counter() - t0) / a.steps)
            states[name] = s
    med = {n: statistics.median(t) for n, t in times.items()}
    print(
        f"device: {jax.devices()[0].device_kind}; width {a.width}, layers {a.layers}, "
        f"batch {a.batch}, {a.rounds} interleaved rounds of {a.steps} steps"
    )
    for n, t in med.items():
        print(f"{n:24s} {1e3 * t:8.3f} ms/step (median)")
    ratio = med["make_constrained_step"] / med["make_train_step"]
    print(f"ratio general / descent: {ratio:.3f}x")


if __name__ == "__main__":
    main()
