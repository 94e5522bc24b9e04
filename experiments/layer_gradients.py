"""How the gradients of consecutive states' losses pull on each other, in a finished run.

    python -m experiments.layer_gradients RUN [--run LABEL ...] [--examples N]

For each named run of the finished run in the ``--out`` folder ``RUN`` (any task; default: every
run that did not diverge), its parameters as its last checkpoint holds them, on the first ``N``
validation examples (the task's first validation batch of that size) at its γ_train with the
runner's evaluation noise (the inputs its ``layer_loss_val`` was computed on): the gradient g_l = ∇_θ ℓ_l of each state's mean loss
with respect to every trained parameter (one state's at a time), and per layer l ≥ 1

* ``cos``: cos(g_(l−1), g_l);
* ``ρ``: ⟨g_(l−1), g_l⟩ / ‖g_l‖². A small step on ℓ_l alone, −η g_l, lowers ℓ_l by η‖g_l‖² and
  ℓ_(l−1) by ρ times that, so it lowers the descent constraint ℓ_l − (1 − ε) ℓ_(l−1) by only
  (1 − (1 − ε) ρ) of its gain in ℓ_l: (1 − ε) ρ is the share the constraint gives back through
  ℓ_(l−1) (near 1, a step on ℓ_l alone hardly moves the constraint);
* ``‖g_l‖`` and the validation loss ℓ_l.

Nothing is trained or written; it prints one table. Bad input is one line, exit status 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import UsageError
from cudt.runner.cli import OneLineParser, exit_process, run_cli
from cudt.runner.combine import load_results
from cudt.runner.finished import finished_run, run_data, trained_params
from cudt.runner.record import evaluation_keys
from cudt.runner.run import evaluation_grids
from experiments.combine import TASKS

__all__ = ["layer_gradients", "main", "markdown"]


def _parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m experiments.layer_gradients", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dir", metavar="RUN", type=Path, help="a finished run's --out folder")
    parser.add_argument(
        "--run",
        action="append",
        metavar="LABEL",
        help="a run's label in results.json (e.g. 'ut-5 ERM seed 0'); repeat for several; "
        "default: every run that did not diverge",
    )
    parser.add_argument(
        "--examples", type=int, default=256, help="validation examples (the first N)"
    )
    return parser


def _val_batch(task, cfg, data, model, gamma: float, count: int):
    """The first ``count`` validation examples in one batch, their indices, and the key of the
    runner's validation noise at ``gamma`` (its evaluation keys folded with γ's index)."""
    n = task.split_size(data, "val", model)
    batch = next(iter(task.eval_batches(data, "val", model, min(count, n))))
    _, val_gammas = evaluation_grids(task, cfg, task.run_specs(cfg))
    _, val_key = evaluation_keys(cfg.data_rng_seed)
    return batch, jax.random.fold_in(val_key, val_gammas.index(gamma))


def _gradients(
    model, params, batch, gamma: float, key
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(losses [L+1], ‖g_l‖² [L+1], ⟨g_(l−1), g_l⟩ [L])``: the mean validation losses of the
    batch's real rows, and the squared norms and consecutive inner products (in float64) of
    their gradients over every parameter.

    One state's gradient at a time (one compiled program, the state's index an argument, the
    losses its auxiliary output: L+1 passes in all), and only the previous gradient kept: two
    gradients' memory, where the whole Jacobian would hold L+1 (for SmolLM2's 31 states, 31
    copies of its 135M parameters).

    The batch, the frozen weights and the noise key are the program's arguments, as the
    runner's evaluation passes them: closed over, they were numpy constants inside the trace,
    where the decoder's response readout indexes its loss mask with traced token positions
    (a TracerArrayConversionError on every llm_sft run), and the program held a copy of them."""
    keep = (np.arange(batch.index.shape[0]) < batch.count).astype(np.float32)

    def state_loss(p, frozen, examples, index, keep, key, state):
        out = model.eval_outputs(p, frozen, examples, index, jnp.float32(gamma), key)
        means = (out["losses"] * keep[:, None]).sum(0) / keep.sum()
        return means[state], means

    grad_of = jax.jit(jax.grad(state_loss, has_aux=True))
    inputs = (model.frozen, batch.examples, jnp.asarray(batch.index), jnp.asarray(keep), key)
    losses, squares, products, before = None, [], [], None
    while losses is None or len(squares) < losses.size:
        grads, means = grad_of(params, *inputs, jnp.int32(len(squares)))
        losses = np.asarray(means, np.float64) if losses is None else losses
        g = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(grads)])
        squares.append(g @ g)
        if before is not None:
            products.append(before @ g)
        before = g
    return losses, np.asarray(squares), np.asarray(products)


def layer_gradients(run_dir: Path, labels: Sequence[str] | None, examples: int) -> list[dict]:
    """One row per named run and layer l ≥ 1 (see the module docstring)."""
    if examples < 1:
        raise UsageError(f"--examples must be >= 1, got {examples}")
    experiment = load_results(run_dir).get("experiment")
    if experiment not in TASKS:
        raise UsageError(f"{run_dir}: unknown experiment {experiment!r}: pass a cudt run's --out")
    task = TASKS[experiment]()
    cfg, data, results = finished_run(run_dir, task, "layer_gradients")
    runs = {r["label"]: r for r in results["runs"]}
    wanted = list(labels) if labels else [k for k, r in runs.items() if not r.get("diverged")]
    if not wanted:
        raise UsageError(f"{run_dir}: every run diverged: name one with --run LABEL to read it")
    unknown = [k for k in wanted if k not in runs]
    if unknown:
        raise UsageError(
            f"{run_dir} has no run {unknown[0]!r}: pass one of {', '.join(map(repr, runs))}"
        )
    params = trained_params(Path(run_dir).expanduser().absolute(), results, wanted, cfg.steps)
    data_of = run_data(task, cfg, data, Path(run_dir).expanduser().absolute())
    rows = []
    for label in wanted:
        record = runs[label]
        draw = data_of(record)
        draw_cfg = (
            cfg
            if cfg.data_seed is not None
            else dataclasses.replace(cfg, data_seed=int(record["seed"]))
        )
        name = record["model"]
        model = task.build(draw_cfg, draw, name, task.structure(cfg, name, record["constrained"]))
        gamma = float(record["hparams"]["gamma_train"])
        batch, key = _val_batch(task, draw_cfg, draw, model, gamma, examples)
        losses, squares, products = _gradients(model, params[label], batch, gamma, key)
        for layer in range(1, losses.size):
            a, b, ab = squares[layer - 1], squares[layer], products[layer - 1]
            rows.append(
                {
                    "label": label,
                    "layer": layer,
                    "loss": float(losses[layer]),
                    "loss_before": float(losses[layer - 1]),
                    "grad_norm": float(np.sqrt(b)),
                    "cos": float(ab / np.sqrt(a * b)) if a > 0 and b > 0 else float("nan"),
                    "rho": float(ab / b) if b > 0 else float("nan"),
                    "examples": int(batch.count),
                    "gamma": gamma,
                }
            )
    return rows


def _signed(x: float) -> str:
    return "n/a" if np.isnan(x) else f"{x:+.3f}"


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table (cos n/a: a state whose loss no parameter moves, the video's
    noisy input, where ρ is 0)."""
    lines = [
        "| run | layer l | ℓ_(l−1) → ℓ_l (val) | ‖g_l‖ | cos(g_(l−1), g_l) | ρ = ⟨g_(l−1), g_l⟩ / ‖g_l‖² |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['layer']} | {r['loss_before']:.4g} → {r['loss']:.4g} | "
            f"{r['grad_norm']:.3g} | {_signed(r['cos'])} | {_signed(r['rho'])} |"
        )
    first = rows[0] if rows else {"examples": 0}
    lines += [
        "",
        f"On {first['examples']} validation examples at each run's γ_train, the runner's noise; "
        "(1 − ε)·ρ: the share of a step on ℓ_l alone that the constraint gives back.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def run():
        print(markdown(layer_gradients(args.run_dir, args.run, args.examples)), end="")

    return run_cli(run)


if __name__ == "__main__":
    exit_process(main())
