"""What the generality costs: ``cudt.make_constrained_step`` vs ``cudt.make_train_step``.

Run from the repository root:

    .venv/bin/python -m benchmarks.general_step            # L=6 layers of width 256, batch 256
    .venv/bin/python -m benchmarks.general_step --quick    # tiny sizes, for the tests

The same descent problem both ways: per-sample losses of every layer's state ``[B, L+1]`` of a
residual MLP (tanh layers, a shared linear read-out), ``make_train_step`` with
``DescentConfig(num_layers=L, epsilon=0.1)`` and the general step with one inequality constraint
``mean ℓ_l − (1−ε) mean ℓ_{l−1} ≤ 0`` of shape ``[L]``. Primal Adam, projected dual ascent, both
jitted, same parameters, batch and key. The steps are interleaved over ``--repeats`` rounds of
``--steps`` steps; prints the median ms/step of each and the ratio general / make_train_step.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import cudt

EPS = 0.1


def make_problem(layers: int, width: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {
        "w": jnp.asarray(rng.normal(size=(layers, width, width)) / np.sqrt(width), jnp.float32),
        "out": jnp.asarray(rng.normal(size=(width,)) / np.sqrt(width), jnp.float32),
    }
    data = (
        jnp.asarray(rng.normal(size=(batch, width)), jnp.float32),
        jnp.asarray(rng.normal(size=(batch,)), jnp.float32),
    )

    def layer_losses(params, batch, key):
        del key
        x, y = batch

        def body(h, w):
            h = h + jnp.tanh(h @ w)
            return h, h

        _, hs = jax.lax.scan(body, x, params["w"])  # [L, B, D]
        states = jnp.concatenate([x[None], hs])  # [L+1, B, D]
        pred = states @ params["out"]  # [L+1, B]
        return ((pred - y[None]) ** 2).T  # [B, L+1]

    def problem(params, batch, key):
        mean = jnp.mean(layer_losses(params, batch, key), axis=0)  # [L+1]
        g = mean[1:] - (1.0 - EPS) * mean[:-1]  # [L]
        return mean[-1], {"descent": cudt.Constraint(g, kind="ineq")}

    return params, data, layer_losses, problem


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="L=2, width 16, batch 8, 2x3 steps")
    a = p.parse_args(argv)
    if a.quick:
        a.layers, a.width, a.batch, a.steps, a.repeats = 2, 16, 8, 3, 2
    params, batch, layer_losses, problem = make_problem(a.layers, a.width, a.batch)
    cfg = cudt.DescentConfig(num_layers=a.layers, epsilon=EPS)
    init_t, step_t = cudt.make_train_step(
        layer_losses, optax.adam(1e-3), cudt.dual_ascent(1e-2), cfg
    )
    init_g, step_g = cudt.make_constrained_step(
        problem, primal=optax.adam(1e-3), dual=cudt.dual_ascent(1e-2)
    )
    states = {"make_train_step": init_t(params), "general": init_g(params, batch)}
    steps = {"make_train_step": step_t, "general": step_g}
    key = jax.random.key(0)
    for name in states:  # compile and warm up
        states[name], m = steps[name](states[name], batch, key)
        jax.block_until_ready(states[name])
    times = {name: [] for name in states}
    for _ in range(a.repeats):
        for name in states:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                states[name], m = steps[name](states[name], batch, key)
            jax.block_until_ready(states[name])
            times[name].append((time.perf_counter() - t0) / a.steps * 1e3)
    med = {name: float(np.median(v)) for name, v in times.items()}
    print(f"device {jax.devices()[0].platform}, L={a.layers}, width {a.width}, batch {a.batch}")
    print(f"{'step':<16} {'ms/step':>10}")
    print("-" * 27)
    for name, v in med.items():
        print(f"{name:<16} {v:>10.3f}")
    ratio = med["general"] / med["make_train_step"]
    print(f"ratio general / make_train_step: {ratio:.3f}")
    return {"ms": med, "ratio": ratio}


if __name__ == "__main__":
    main()
