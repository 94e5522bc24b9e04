"""Phase I: does a model have a point that meets every descent constraint?

The phase-I problem minimises the constraints' total normalised violation,
``Σ_l max(0, ℓ_l / ℓ_{l−1} − (1 − ε))`` (:func:`cudt.descent.violation`), trained by the same
step as every run (:func:`cudt.make_train_step` with ``objective="violation"``, an ERM run: no
multipliers) with the model's own projection after each update. Its minimum is 0 exactly when
a feasible point exists; a run that cannot bring it to 0 from two starts, the model's
initialisation and the ERM solution, is reported with the violation it reached.

Two starts, as seeds × starts in one vmapped program:

* ``init``: the model's own initialisation (the UT's DCT start), ``steps`` phase-I steps;
* ``erm``: ``steps`` ERM steps (mean ℓ_L, the ERM run's optimiser), then ``steps`` phase-I
  steps from there with a fresh optimiser.

The verdict reads the VALIDATION split at γ_train (mean per-layer losses over the whole split,
the noise a function of the example index as in every evaluation): the violation left and the
largest relative violation ``max_l (ℓ_l − (1 − ε) ℓ_{l−1}) / ℓ_{l−1}``, which is ``<= 0`` when
the point is feasible.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cudt import descent
from cudt.constrained import dual_ascent
from cudt.descent import DescentConfig, make_train_step
from cudt.loop import sample_indices
from cudt.optim import primal_optimizer
from cudt.runner.task import RunBatch

__all__ = ["STARTS", "phase_one", "relative_violation"]

STARTS = ("init", "erm")


def relative_violation(mean_losses, epsilon: float) -> np.ndarray:
    """``[L]``: ``(ℓ_l − (1 − ε) ℓ_{l−1}) / ℓ_{l−1}`` of the mean losses ``[L+1]`` (<= 0: met)."""
    m = np.asarray(mean_losses, np.float64)
    return (m[1:] - (1.0 - epsilon) * m[:-1]) / np.maximum(m[:-1], descent.RATIO_FLOOR)


def phase_one(model, train, val, *, gamma, epsilon, steps, seeds, lr, batch_size, eval_batch=256):
    """Phase I of ``model`` (a :class:`cudt.runner.task.GroupModel`) from both :data:`STARTS`.

    ``train``, ``val``: the splits' clean examples ``[N, ...]``; ``gamma``: γ_train; ``epsilon``:
    the constraints' ε; ``steps``: phase-I steps (and ERM steps before the ``erm`` start);
    ``seeds``: how many seeds (0..seeds-1: the init and the batches). Returns, per start, the
    per-seed ``violation`` (the phase-I objective on validation), ``max_relative_violation``,
    ``layer_loss [seeds, L+1]`` (validation means), ``feasible`` (violation 0 to 1e-6) and the
    training objective's last value."""
    L = model.num_layers
    cfg = DescentConfig(num_layers=L, epsilon=epsilon, constrained=False)
    primal = primal_optimizer(lr, "constant", 2 * steps)
    dual = dual_ascent(1.0)  # never used: ERM runs move no multiplier
    make = lambda objective: make_train_step(  # noqa: E731
        model.layer_losses,
        primal,
        dual,
        cfg,
        objective=objective,
        project_params=model.project,
        jit=False,
    )
    erm_init, erm_step = make("loss")
    p1_init, p1_step = make("violation")
    train = jnp.asarray(train)
    num_train = train.shape[0]

    def run(step, state, key, n):
        def body(state, _):
            idx = sample_indices(key, state.step, num_train, batch_size)
            batch = RunBatch(train[idx], jnp.float32(gamma), None, idx)
            return step(state, batch, key)

        state, metrics = jax.lax.scan(body, state, None, length=n)
        return state, metrics["objective"][-1]

    def one_seed(key):
        params = model.init(jax.random.fold_in(key, 1))
        from_init, obj_init = run(p1_step, p1_init(params), key, steps)
        erm, _ = run(erm_step, erm_init(params), key, steps)
        from_erm, obj_erm = run(p1_step, p1_init(erm.params), jax.random.fold_in(key, 2), steps)
        return (from_init.params, from_erm.params), (obj_init, obj_erm)

    keys = jnp.stack([jax.random.key(s) for s in range(seeds)])
    (p_init, p_erm), (o_init, o_erm) = jax.jit(jax.vmap(one_seed))(keys)

    val = jnp.asarray(val)
    eval_key = jax.random.key(0x7A1)

    @jax.jit
    def val_means(params):  # [L+1] mean over the whole validation split
        total = jnp.zeros(L + 1)
        for first in range(0, val.shape[0], eval_batch):
            chunk = val[first : first + eval_batch]
            idx = (jnp.arange(chunk.shape[0]) + first,)
            out = model.eval_outputs(params, None, chunk, idx, jnp.float32(gamma), eval_key)
            total = total + out["losses"].sum(0)
        return total / val.shape[0]

    report = {}
    for start, params, obj in (("init", p_init, o_init), ("erm", p_erm, o_erm)):
        means = np.stack(
            [np.asarray(val_means(jax.tree.map(lambda a, s=s: a[s], params))) for s in range(seeds)]
        )
        viol = np.asarray(descent.violation(jnp.asarray(means), epsilon), np.float64)
        rel = np.stack([relative_violation(m, epsilon) for m in means])
        report[start] = {
            "violation": viol.tolist(),
            "max_relative_violation": rel.max(axis=1).tolist(),
            "layer_loss": means.tolist(),
            "feasible": [bool(v <= 1e-6) for v in viol],
            "train_objective": np.asarray(obj, np.float64).tolist(),
        }
    return report
