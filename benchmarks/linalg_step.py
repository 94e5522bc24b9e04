"""The step with exact LAPACK decompositions vs the matmul-only methods, side by side.

Run from the repository root:

    .venv/bin/python -m benchmarks.linalg_step              # UT-5 and DUST-5, batch 32; ~2 min

The constrained step of the video setting (``VIDEO`` in ``benchmarks/_common.py``), jitted and
donating, in two versions (DUST) or three (UT), interleaved over ``--repeats`` repetitions of
``--steps``:

* DUST-5 (one dictionary per layer): ``DUST(linalg="lapack")``, the LISTA step sizes
  ``μ_l = ‖D_l‖²`` by ``eigvalsh`` and the dual-frame code by ``solve``, vs
  ``DUST(linalg="matmul")`` (the default): Lanczos and Newton–Schulz (``cudt.linalg``);
* UT-5, three clippings of ``W̃_f``: ``ut_project(method="eigh")`` (LAPACK) vs
  ``method="newton_schulz"`` (the previous default: Newton–Schulz sign and inverse square
  root, 26 matmuls) vs ``method="matmul"`` (the default: a 64-step Lanczos run, deflation of
  the Ritz pairs past the clip, certified by a second Lanczos run, else Newton–Schulz).

Before timing, each matmul method is compared with the exact one on the same inputs after a
few training steps (``--train-steps``, so the matrices are not the DCT init): DUST's ``μ_l``
(max relative error) and dual-frame encoder (max abs error / max abs value); the UT's
projection of ``W̃_f`` after one more optimiser step (max abs error, how far the eigenvalues
went past the clip before projecting, and which path the default took). LAPACK threads:
``--lapack-threads`` (default 1, what the runner's ``configure_process`` sets; 0 keeps
OpenBLAS's default, one per core).
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
# the UT's clippings (ut_project's methods), the exact one first
UT_CLIPS = {"eigh": "LAPACK", "newton_schulz": "Newton–Schulz", "matmul": "Lanczos (default)"}


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
    exact = np.asarray(ut_project(tree, method="eigh")["ffn"], np.float64)
    _, path = linalg.clip_eigenvalues_matmul(sym, 0.95, return_path=True)
    rows = []
    for method, label in (
        ("newton_schulz", "Newton–Schulz"),
        ("matmul", f"default, path {linalg.CLIP_PATHS[int(path)]}"),
    ):
        ours = np.asarray(ut_project(tree, method=method)["ffn"], np.float64)
        quantity = f"clip of W̃_f ({label}), max |λ| − 0.95 = {over:.3g}"
        rows.append([name, quantity, float(np.abs(ours - exact).max())])
    return rows


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
        ways = UT_CLIPS if model_name == "ut" else WAYS
        for way, label in ways.items():
            if model_name == "ut":
                setup = make_video_setup(
                    model_name, train_x, sigma, layers=args.layers, ut_clip=way
                )
            else:
                setup = make_video_setup(model_name, train_x, sigma, layers=args.layers, linalg=way)
            state = trained(setup, batch, key, args.train_steps)
            if way == "matmul":
                acc += accuracy_rows(setup, copy_tree(state), batch, key)
            steps = JaxSteps(setup.step, state, batch, key)
            alternatives[(setup.name, label)] = lambda s=steps: s.block(args.steps)
    ms = {k: 1e3 * v for k, v in time_alternatives(alternatives, args.repeats).items()}
    print(f"\naccuracy of the matmul methods against LAPACK, after {args.train_steps} steps")
    print_table(["model", "quantity", "max error (relative for μ and the encoder)"], acc)
    rows = []
    for (model, way), value in ms.items():
        rows.append([model, way, value, value / ms[(model, WAYS["exact"])]])
    print(f"\nsteady state: median ms/step over {args.repeats} repetitions")
    print_table(["model", "linear algebra", "ms/step", "this / LAPACK"], rows)
    for model, way in ms:
        if way != WAYS["exact"]:
            ratio = ms[(model, way)] / ms[(model, WAYS["exact"])]
            print(f"ratio {model}: {way} / LAPACK = {ratio:.3g}")
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


if __name__ == "__main__":
    main()
