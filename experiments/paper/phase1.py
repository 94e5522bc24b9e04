"""Phase I: does a model have a point that meets every descent constraint?

The phase-I problem minimises the constraints' total normalised violation,
``Σ_l max(0, ℓ_l / ℓ_{l−1} − (1 − ε))`` (:func:`cudt.descent.violation`) over the steps the
runner judges (:func:`cudt.descent.judged_steps`, each batch's means by the rule of
:func:`cudt.metrics.applicable_steps`: not a step from a state at the loss floor, the clean
ℓ_0 = 0 at γ_train 0), trained by the same step as every run (:func:`cudt.make_train_step`
with ``objective="judged_violation"``, an ERM run: no multipliers) with the model's own
projection after each update. Its minimum is 0 exactly when a feasible point exists; a run that
cannot bring it to 0 from two starts, the model's initialisation and the ERM solution, is
reported with the violation it reached.

Two starts, as seeds × starts in one vmapped program:

* ``init``: the model's own initialisation (the UT's DCT start), ``steps`` phase-I steps;
* ``erm``: ``steps`` ERM steps (mean ℓ_L, the ERM run's optimiser), then ``steps`` phase-I
  steps from there with a fresh optimiser.

The verdict reads the VALIDATION split at γ_train (mean per-layer losses over the whole split,
the noise a function of the example index as in every evaluation): the violation left and the
largest relative violation ``max_l (ℓ_l − (1 − ε) ℓ_{l−1}) / ℓ_{l−1}``, which is ``<= 0`` when
the point is feasible. Any model of the runner (a :class:`cudt.runner.task.GroupModel` whose
examples are one array) runs it: the UT study (:mod:`experiments.paper.ut_study`) on each
variant, ``python -m experiments.phase_one`` on the video task's models.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cudt import descent
from cudt.constrained import dual_ascent
from cudt.descent import DescentConfig, make_train_step
from cudt.loop import sample_indices
from cudt.metrics import applicable_steps
from cudt.optim import primal_optimizer
from cudt.runner.task import RunBatch

__all__ = [
    "ERM_POINT",
    "STARTS",
    "judged_violation",
    "phase_one",
    "relative_violation",
    "split_means",
    "train_phase_one",
]

STARTS = ("init", "erm")
ERM_POINT = "erm_point"  # the ERM solution itself, before phase I (train_phase_one's third)


def relative_violation(mean_losses, epsilon: float) -> np.ndarray:
    """``[L]``: ``(ℓ_l − (1 − ε) ℓ_{l−1}) / ℓ_{l−1}`` of the mean losses ``[L+1]`` (<= 0: met)."""
    m = np.asarray(mean_losses, np.float64)
    return (m[1:] - (1.0 - epsilon) * m[:-1]) / np.maximum(m[:-1], descent.RATIO_FLOOR)


def judged_violation(means, epsilon: float) -> tuple[np.ndarray, list]:
    """Per row of mean losses ``[S, L+1]``: the total violation ``Σ_l max(0, ℓ_l / ℓ_{l−1} −
    (1 − ε))`` and the largest relative violation (None where none is judged), over the
    constraints the runner judges: a state at the loss floor (the clean ℓ_0 = 0 at γ_train 0)
    cannot be undercut (:func:`cudt.metrics.applicable_steps`), so its step is left out, as the
    runner's verdicts leave it."""
    means = np.asarray(means, np.float64)
    judged = np.stack([applicable_steps(m) for m in means])
    prev = np.maximum(means[:, :-1], descent.RATIO_FLOOR)
    terms = np.maximum(means[:, 1:] / prev - (1.0 - epsilon), 0.0)
    viol = np.where(judged, terms, 0.0).sum(axis=1)
    rel = np.where(judged, np.stack([relative_violation(m, epsilon) for m in means]), -np.inf)
    return viol, [float(r) if np.isfinite(r) else None for r in rel.max(axis=1)]


def train_phase_one(
    model, train, *, gamma, epsilon, steps, seeds: int | Sequence[int], lr, batch_size
) -> dict[str, tuple]:
    """Phase I of ``model`` from both :data:`STARTS` on the clean training examples ``train
    [N, ...]`` at γ_train ``gamma``: ``{start: (params [S, ...], last objective [S])}``, and
    under :data:`ERM_POINT` the ERM solution the ``erm`` start begins from (its last mean ℓ_L).

    ``seeds``: a count (seeds 0..seeds-1) or the seeds themselves; seed s keys the init and
    the batches (``jax.random.key(s)``), every seed one lane of one vmapped program."""
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
    # the steps the runner's verdicts judge, decided on each batch's means by their rule: a
    # step from a state at the loss floor (ℓ_0 = 0 at γ_train 0) is no constraint to meet
    p1_init, p1_step = make("judged_violation")
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
        erm, obj_loss = run(erm_step, erm_init(params), key, steps)
        # both phase-I runs (from the init, from the ERM point) as one loop over the starts: the
        # step is compiled once, not once per start (the same computation on each)
        starts = jax.tree.map(lambda *s: jnp.stack(s), p1_init(params), p1_init(erm.params))
        keys = jnp.stack([key, jax.random.fold_in(key, 2)])
        (ends, objs) = jax.lax.map(lambda sk: run(p1_step, *sk, steps), (starts, keys))
        from_init, from_erm = (jax.tree.map(lambda a, i=i: a[i], ends.params) for i in (0, 1))
        return (from_init, from_erm, erm.params), (objs[0], objs[1], obj_loss)

    ids = range(seeds) if isinstance(seeds, int) else seeds
    keys = jnp.stack([jax.random.key(int(s)) for s in ids])
    params, objectives = jax.jit(jax.vmap(one_seed))(keys)
    return dict(zip((*STARTS, ERM_POINT), zip(params, objectives, strict=True), strict=True))


def split_means(model, eval_batch: int = 256):
    """``means(params, examples, gamma, key) -> [S, L+1]``: each seed's mean per-layer losses
    over the whole split ``examples`` at ``gamma`` (``params``: stacked over S seeds), the
    noise of example i drawn from ``key`` and i, as the runner's evaluation draws it (so the
    cut into batches does not matter). One compiled program for every split, start and seed:
    batches of ``eval_batch`` rows, the last one padded and masked."""

    @jax.jit
    def chunk_sums(params, chunk, first, count, gamma, key):  # [S, L+1]
        idx = first + jnp.arange(chunk.shape[0])
        keep = (jnp.arange(chunk.shape[0]) < count)[:, None]

        def one(p):
            # the index array [B], as the runner passes it (cudt.runner.record): the noise of
            # row i keyed by its example's index, whatever the batch
            out = model.eval_outputs(p, None, chunk, idx, gamma, key)
            return jnp.sum(jnp.where(keep, out["losses"], 0.0), axis=0)

        return jax.vmap(one)(params)

    def means(params, examples, gamma, key) -> np.ndarray:
        examples = np.asarray(examples)
        n = examples.shape[0]
        total = 0.0
        for first in range(0, n, eval_batch):
            chunk = examples[first : first + eval_batch]
            count = chunk.shape[0]
            if count < eval_batch:  # one shape: the last batch padded with its first row
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], eval_batch - count, 0)])
            sums = chunk_sums(params, chunk, first, count, jnp.float32(gamma), key)
            total = total + np.asarray(sums, np.float64)
        return total / n

    return means


def phase_one(model, train, val, *, gamma, epsilon, steps, seeds, lr, batch_size, eval_batch=256):
    """Phase I of ``model`` (a :class:`cudt.runner.task.GroupModel`) from both :data:`STARTS`.

    ``train``, ``val``: the splits' clean examples ``[N, ...]``; ``gamma``: γ_train; ``epsilon``:
    the constraints' ε; ``steps``: phase-I steps (and ERM steps before the ``erm`` start);
    ``seeds``: how many seeds (0..seeds-1: the init and the batches). Returns, per start, the
    per-seed ``violation`` (the phase-I objective on validation, over the constraints the runner
    judges: :func:`cudt.metrics.applicable_steps`), ``max_relative_violation`` (None: none judged),
    ``layer_loss [seeds, L+1]`` (validation means), ``feasible`` (violation 0 to 1e-6) and the
    training objective's last value."""
    trained = train_phase_one(
        model,
        train,
        gamma=gamma,
        epsilon=epsilon,
        steps=steps,
        seeds=seeds,
        lr=lr,
        batch_size=batch_size,
    )
    eval_key = jax.random.key(0x7A1)
    val_means = split_means(model, min(eval_batch, len(val)))
    report = {}
    for start in STARTS:
        params, obj = trained[start]
        means = val_means(params, val, gamma, eval_key)
        viol, rel = judged_violation(means, epsilon)
        report[start] = {
            "violation": viol.tolist(),
            "max_relative_violation": rel,
            "layer_loss": means.tolist(),
            "feasible": [bool(v <= 1e-6) for v in viol],
            "train_objective": np.asarray(obj, np.float64).tolist(),
        }
    return report
