"""What the constraints cost: cudt's constrained step vs its ERM step, same model, same data.

Run from the repository root:

    .venv/bin/python -m benchmarks.erm_vs_constrained       # UT-5 and DUST-5, batch 32; ~1 min

Three steps of the same model (the video setting, ``VIDEO`` in ``benchmarks/_common.py``), all
jitted with the state donated, from the same parameters, on the same batch and key:

* ``constrained``: ``cudt.make_train_step`` with ``DescentConfig(num_layers=L)``: Lagrangian
  of the L descent constraints, primal Adam, projected dual ascent;
* ``ERM``: the same call with ``DescentConfig(num_layers=L, constrained=False)``. ``constrained``
  is a per-run flag in the train state (``TrainState.constrained``), so this is the SAME
  compiled program as the constrained one, with the dual update masked off: λ stays 0;
* ``plain ERM``: what an ERM user would write without cudt, for reference: ``value_and_grad``
  of mean ℓ_L alone, ``optax.adam``, the same parameter projection (no per-layer losses in the
  objective, no multipliers, no dual state).

DUST uses one dictionary per layer in all three (the paper's constrained model; its ERM
baseline in the experiment has one shared dictionary, a different model). The steps are
interleaved over ``--repeats`` repetitions of ``--steps`` steps. Prints the median ms/step,
each compile time (``jax.jit(step).lower(...).compile()``) and the ratios to cudt's ERM step.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

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

KINDS = ("plain ERM", "ERM", "constrained")
G3 = {"float_kind": lambda v: f"{v:.3g}"}  # numpy print format


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=20, repeats=7, quick_help="L=1, batch 4, 1 repeat")
    return parse_video_args(p, argv, quick=dict(layers=1, batch_size=4, steps=2, repeats=1))


def plain_erm(setup):
    """``(init, step)`` of ERM without cudt: mean ℓ_L, ``optax.adam``, the same projection."""
    optimizer = optax.adam(VIDEO["lr"])

    def loss(params, batch, key):
        return jnp.mean(setup.layer_losses(params, batch, key)[:, -1])

    def init(params):
        return copy_tree(params), optimizer.init(params), jnp.zeros((), jnp.int32)

    def step(state, batch, key):
        params, opt_state, count = state
        value, grads = jax.value_and_grad(loss)(params, batch, jax.random.fold_in(key, count))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if setup.project is not None:
            params = setup.project(params)
        return (params, opt_state, count + 1), {"objective": value}

    return init, step


def main(argv=None) -> None:
    run_main("benchmarks.erm_vs_constrained", argv, parse_args, run)


def run(args: argparse.Namespace, lapack: str) -> None:
    print(lapack)
    t_total = time.perf_counter()
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    print(
        f"video denoising: batch {args.batch_size}x{args.seq_len}x{train_x.shape[-1]}, "
        f"L = {args.layers}; {args.repeats} interleaved repetitions of {args.steps} steps"
    )
    alternatives, compile_s, names = {}, {}, []
    for model_name in args.models:
        first = {}
        for kind in KINDS:
            setup = make_video_setup(
                model_name,
                train_x,
                sigma,
                layers=args.layers,
                constrained=kind == "constrained",
                jit=False,
            )
            if kind == "plain ERM":
                init, pure = plain_erm(setup)
            else:
                init, pure = setup.init, setup.step
            state = init(copy_tree(setup.params))
            t0 = time.perf_counter()
            step = jax.jit(pure, donate_argnums=0).lower(state, batch, key).compile()
            compile_s[(setup.name, kind)] = time.perf_counter() - t0
            first[kind] = step(copy_tree(state), batch, key)[1]  # one step from the same start
            steps = JaxSteps(step, state, batch, key)
            alternatives[(setup.name, kind)] = lambda s=steps: s.block(args.steps)
        names.append(setup.name)
        objectives = [float(first[kind]["objective"]) for kind in KINDS]
        print(
            f"same work, {setup.name}: first step's objective mean ℓ_L max - min over the three "
            f"= {max(objectives) - min(objectives):.3g} (of {objectives[0]:.4g}); multipliers "
            f"after it: ERM {np.array2string(np.asarray(first['ERM']['multipliers']), formatter=G3)}, "
            "constrained "
            f"{np.array2string(np.asarray(first['constrained']['multipliers']), formatter=G3)}"
        )
    ms = {name: 1e3 * s for name, s in time_alternatives(alternatives, args.repeats).items()}
    rows = [
        [
            model,
            kind,
            compile_s[(model, kind)],
            ms[(model, kind)],
            ms[(model, kind)] / ms[(model, "ERM")],
        ]
        for model in names
        for kind in KINDS
    ]
    print(f"\nsteady state: median ms/step over {args.repeats} interleaved repetitions")
    print_table(["model", "step", "compile s", "ms/step", "this / ERM"], rows)
    for model in names:
        print(
            f"ratio {model}: constrained / ERM = "
            f"{ms[(model, 'constrained')] / ms[(model, 'ERM')]:.3g}"
        )
        print(
            f"ratio {model}: constrained / plain ERM = "
            f"{ms[(model, 'constrained')] / ms[(model, 'plain ERM')]:.3g}"
        )
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


if __name__ == "__main__":
    main()
