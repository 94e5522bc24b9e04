"""The step with exact LAPACK decompositions vs the matmul-only methods, side by side.

Run from the repository root:

    .venv/bin/python -m benchmarks.linalg_step              # UT-5 and DUST-5, batch 32; ~2 min

The constrained step of the video setting (``VIDEO`` in ``benchmarks/_common.py``), jitted and
donating, in two versions per model, interleaved over ``--repeats`` repetitions of ``--steps``:

* DUST-5 (one dictionary per layer): ``DUST(linalg="lapack")``, the LISTA step sizes
  ``μ_l = ‖D_l‖²`` by ``eigvalsh`` and the dual-frame code by ``solve``, vs
  ``DUST(linalg="matmul")`` (the default): Lanczos and Newton–Schulz (``cudt.linalg``);
* UT-5: ``ut_project(method="eigh")`` vs ``ut_project(method="matmul")`` (the default: a
  Lanczos skip test, then Newton–Schulz sign and inverse square root).

Before timing, each matmul method is compared with the exact one on the same inputs after a
few training steps (``--train-steps``, so the matrices are not the DCT init): DUST's ``μ_l``
(max relative error) and dual-frame encoder (max abs error / max abs value); the UT's
projection of ``W̃_f`` after one more optimiser step (max abs error, how far the eigenvalues
went past the clip before projecting). LAPACK threads: ``--lapack-threads`` (default 1, what
the runner's ``configure_process`` sets; 0 keeps OpenBLAS's default, one per core).
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp
import numpy as np
import optax

import cudt
from benchmarks._common import (
    VIDEO,
    JaxSteps,
    copy_tree,
    make_video_setup,
    parse_video_args,
    print_table,
    run_main,
    time_alternatives,
    video_batch,
    video_parser,
)
from cudt import linalg
from cudt.models import ut_project

WAYS = {"exact": "LAPACK", "matmul": "matmul only"}


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=10, repeats=5, quick_help="L=2, batch 4, 1 repeat")
    p.add_argument(
        "--train-steps", type=int, default=20, help="steps before the accuracy check (20)"
    )
    quick = dict(layers=2, batch_size=4, steps=2, repeats=1, train_steps=2)
    return parse_video_args(p, argv, quick=quick)


def trained(setup, batch, key, steps: int):
    state = setup.init(copy_tree(setup.params))
    for _ in range(steps):
        state, _ = setup.step(state, batch, key)
    return state


def accuracy_rows(setup, state, batch, key) -> list[list]:
    name, params = setup.name, state.params["params"]
    if name.startswith("DUST"):
        d = params["dictionary"]  # [L, P, K]
        d64 = np.asarray(d, np.float64)
        exact = np.linalg.eigvalsh(np.einsum("lpk,lqk->lpq", d64, d64))[:, -1]
        ours = np.asarray(linalg.gram_top_eigenvalue(d), np.float64)
        gram = d[0] @ d[0].T
        enc = np.asarray(linalg.spd_solve(gram, d[0], jnp.float32(ours[0])), np.float64)
        enc_exact = np.linalg.solve(d64[0] @ d64[0].T, d64[0])
        return [
            [name, "μ_l = ‖D_l‖² (Lanczos)", float(np.max(np.abs(ours - exact) / exact))],
            [
                name,
                "(D₀D₀ᵀ)⁻¹D₀ (Newton–Schulz)",
                float(np.abs(enc - enc_exact).max() / np.abs(enc_exact).max()),
            ],
        ]
    # UT: one more step without the projection, then both projections of the same W̃_f
    _, bare_step = cudt.make_train_step(
        setup.layer_losses,
        optax.adam(VIDEO["lr"]),
        cudt.dual_ascent(VIDEO["dual_lr"]),
        setup.config,
    )
    state, _ = bare_step(state, batch, key)
    ffn = state.params["params"]["ffn"]
    sym = 0.5 * (ffn + ffn.T)
    over = float(np.abs(np.linalg.eigvalsh(np.asarray(sym, np.float64))).max() - 0.95)
    tree = {"attn": ffn, "ffn": ffn, "bias": ffn[0]}
    ours = np.asarray(ut_project(tree, method="matmul")["ffn"], np.float64)
    exact = np.asarray(ut_project(tree, method="eigh")["ffn"], np.float64)
    return [
        [
            name,
            f"clip of W̃_f (Newton–Schulz), max |λ| − 0.95 = {over:.3g}",
            float(np.abs(ours - exact).max()),
        ]
    ]


def main(argv=None) -> None:
    run_main("benchmarks.linalg_step", argv, parse_args, run)


def run(args: argparse.Namespace, lapack: str) -> None:
    print(lapack)
    t_total = time.perf_counter()
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    print(
        f"video denoising, constrained step: batch {args.batch_size}x{args.seq_len}x"
        f"{train_x.shape[-1]}, L = {args.layers}; {args.repeats} interleaved repetitions of "
        f"{args.steps} steps"
    )
    alternatives, acc = {}, []
    for model_name in args.models:
        for way in WAYS:
            setup = make_video_setup(model_name, train_x, sigma, layers=args.layers, linalg=way)
            state = trained(setup, batch, key, args.train_steps)
            if way == "matmul":
                acc += accuracy_rows(setup, copy_tree(state), batch, key)
            steps = JaxSteps(setup.step, state, batch, key)
            alternatives[(setup.name, WAYS[way])] = lambda s=steps: s.block(args.steps)
    ms = {k: 1e3 * v for k, v in time_alternatives(alternatives, args.repeats).items()}
    print(f"\naccuracy of the matmul methods against LAPACK, after {args.train_steps} steps")
    print_table(["model", "quantity", "max error (relative for μ and the encoder)"], acc)
    rows = []
    for (model, way), value in ms.items():
        rows.append([model, way, value, value / ms[(model, WAYS["exact"])]])
    print(f"\nsteady state: median ms/step over {args.repeats} repetitions")
    print_table(["model", "linear algebra", "ms/step", "this / LAPACK"], rows)
    for model in dict.fromkeys(m for m, _ in ms):
        ratio = ms[(model, WAYS["matmul"])] / ms[(model, WAYS["exact"])]
        print(f"ratio {model}: matmul only / LAPACK = {ratio:.3g}")
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


if __name__ == "__main__":
    main()
