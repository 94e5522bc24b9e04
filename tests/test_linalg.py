"""cudt.linalg: same values and gradients as jnp.linalg, and never a batched LAPACK call on CPU.

The batched-call check is structural (the compiled HLO), not a timing or a hang test: jaxlib
0.10's batched CPU LAPACK calls can deadlock each other (see cudt/linalg.py), so under ``vmap``
every ``lapack_*`` custom call must see a single matrix.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cudt import linalg
from cudt.models import DUST, UT, ut_project


def _spd(seed: int, n: int, batch: tuple[int, ...] = ()) -> jax.Array:
    a = np.random.default_rng(seed).normal(size=(*batch, n, n)).astype(np.float32)
    return jnp.asarray(a @ np.swapaxes(a, -1, -2) / n + np.eye(n, dtype=np.float32))


def _lapack_operand_ranks(fn, *args) -> list[int]:
    """Rank of the first operand of every LAPACK custom call in ``fn``'s compiled HLO."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    ranks = []
    for line in text.splitlines():
        if "custom-call(" in line and 'custom_call_target="lapack_' in line:
            shapes = re.search(r"operand_layout_constraints=\{(\w+)\[([\d,]*)\]", line)
            assert shapes is not None, line
            ranks.append(len(shapes.group(2).split(",")))
    return ranks


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_values_match_jnp_linalg(batch):
    a, b = _spd(0, 6, batch), _spd(1, 6, batch)[..., :4]
    w, v = linalg.eigh(a)
    w_ref, _ = jnp.linalg.eigh(a)
    np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-5)
    # eigenvectors are defined up to sign: check the decomposition instead
    np.testing.assert_allclose(jnp.einsum("...ik,...k,...jk->...ij", v, w, v), a, atol=1e-4)
    np.testing.assert_allclose(linalg.eigvalsh(a), w_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(linalg.solve(a, b), jnp.linalg.solve(a, b), rtol=1e-4, atol=1e-5)


def test_solve_gradient_matches_jnp_linalg_also_under_vmap():
    a, b = _spd(2, 5, (3,)), _spd(3, 5, (3,))[..., :2]

    def loss(solver, a, b):
        return jnp.sum(jnp.sin(solver(a, b)))

    ours = jax.vmap(jax.grad(lambda a, b: loss(linalg.solve, a, b), argnums=(0, 1)))(a, b)
    ref = jax.vmap(jax.grad(lambda a, b: loss(jnp.linalg.solve, a, b), argnums=(0, 1)))(a, b)
    for x, y in zip(ours, ref, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_vmapped_calls_stay_unbatched_on_cpu():
    a = _spd(4, 8, (4,))

    def both(a):  # two independent LAPACK ops: the pattern that deadlocked
        return linalg.eigvalsh(a).sum() + linalg.solve(a, a).sum() + linalg.eigh(a)[0].sum()

    ranks = _lapack_operand_ranks(jax.vmap(both), a)
    assert ranks and set(ranks) == {2}, ranks
    # the check itself can fail: plain jnp.linalg under vmap emits rank-3 LAPACK calls
    ref = _lapack_operand_ranks(jax.vmap(lambda a: jnp.linalg.eigvalsh(a).sum()), a)
    assert 3 in ref


def test_models_under_vmap_emit_only_unbatched_lapack_calls():
    x = jnp.zeros((2, 3, 256))
    dust = DUST(num_layers=2)
    params = jax.vmap(lambda k: dust.init(k, x))(jax.random.split(jax.random.key(0), 2))

    def dust_loss(p):
        return jnp.mean(dust.apply(p, x)[0] ** 2)

    ranks = _lapack_operand_ranks(jax.vmap(jax.grad(dust_loss)), params)
    assert ranks and set(ranks) == {2}, ranks

    ut = UT(num_layers=2, dim=16)
    ut_params = jax.vmap(lambda k: ut.init(k, jnp.zeros((2, 3, 16))))(
        jax.random.split(jax.random.key(1), 3)
    )
    ranks = _lapack_operand_ranks(jax.vmap(ut_project), ut_params)
    assert ranks and set(ranks) == {2}, ranks
