"""Dense linear algebra that is safe to ``vmap`` on the CPU backend of jaxlib 0.10.

Why this module exists: on CPU, jaxlib 0.10.x runs a *batched* LAPACK custom call
(``eigh``/``eigvalsh``/``solve`` on ``[N, n, n]``, which is what ``vmap`` over seeds or sweep
points produces) through ``ParallelBatchMap`` on XLA's intra-op thread pool, and waits there for
its own tasks. When two such calls are independent in the graph (DUST's ``eigvalsh`` and
``solve``; UT's ``eigh`` next to another one) XLA runs them concurrently, both wait inside the
pool, and on a machine with few cores (2 here) nothing is left to run their tasks: the program
deadlocks with 0 % CPU. Unbatched LAPACK calls run inline and never deadlock.

The wrappers below keep every LAPACK call unbatched on CPU: under ``vmap`` (a
``jax.custom_batching.custom_vmap`` rule) and for explicit leading batch axes they loop over the
batch with ``lax.map``. On GPU/TPU they call the batched ``jnp.linalg`` kernels directly. The
loop costs little here: the matrices are a few hundred wide and the batch is the number of seeds.
Gradients: ``solve`` carries a ``custom_vjp`` whose backward pass is another (safe) solve;
``eigh``/``eigvalsh`` are used behind ``stop_gradient`` or in projections and define no
derivative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["eigh", "eigvalsh", "solve"]


def _cpu() -> bool:
    return jax.default_backend() == "cpu"


def _unbatched(fn: Callable[..., Any], core_ndims: tuple[int, ...]) -> Callable[..., Any]:
    """``fn`` on arguments with exactly ``core_ndims`` dims, run one matrix at a time on CPU.

    Leading axes beyond ``core_ndims`` (all arguments must share them) and ``vmap`` axes are
    looped over with ``lax.map`` on CPU, batched natively elsewhere.
    """
    safe = jax.custom_batching.custom_vmap(fn)

    @safe.def_vmap
    def _rule(axis_size: int, in_batched: list[bool], *args: jax.Array) -> tuple[Any, Any]:
        args = tuple(
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched, strict=True)
        )
        if _cpu():
            out = jax.lax.map(lambda xs: safe(*xs), args)
        else:
            out = jax.vmap(fn)(*args)
        return out, jax.tree.map(lambda _: True, out)

    def call(*args: jax.Array) -> Any:
        lead = args[0].shape[: args[0].ndim - core_ndims[0]]
        for a, n in zip(args, core_ndims, strict=True):
            if a.shape[: a.ndim - n] != lead:
                raise ValueError(
                    f"batch axes differ: {[x.shape for x in args]} (core ndims {core_ndims})"
                )
        if not lead:
            return safe(*args)
        flat = tuple(
            a.reshape(-1, *a.shape[a.ndim - n :]) for a, n in zip(args, core_ndims, strict=True)
        )
        out = jax.vmap(safe)(*flat)  # goes through the rule above
        return jax.tree.map(lambda o: o.reshape(*lead, *o.shape[1:]), out)

    return call


_eigh = _unbatched(lambda a: tuple(jnp.linalg.eigh(a)), (2,))
_eigvalsh = _unbatched(lambda a: jnp.linalg.eigvalsh(a), (2,))
_solve = _unbatched(lambda a, b: jnp.linalg.solve(a, b), (2, 2))


def eigh(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``jnp.linalg.eigh`` of symmetric ``a [..., n, n]``: ``(eigenvalues, eigenvectors)``."""
    return _eigh(a)


def eigvalsh(a: jax.Array) -> jax.Array:
    """``jnp.linalg.eigvalsh`` of symmetric ``a [..., n, n]``, ascending."""
    return _eigvalsh(a)


@jax.custom_vjp
def solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """``x = a⁻¹ b`` for ``a [..., n, n]`` and a matrix right-hand side ``b [..., n, k]``."""
    return _solve(a, b)


def _solve_fwd(a: jax.Array, b: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    x = _solve(a, b)
    return x, (a, x)


def _solve_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    a, x = res
    gb = _solve(jnp.swapaxes(a, -1, -2), g)  # ∂/∂b = a⁻ᵀ g
    ga = -jnp.einsum("...ik,...jk->...ij", gb, x)  # ∂/∂a = −a⁻ᵀ g xᵀ
    return ga, gb


solve.defvjp(_solve_fwd, _solve_bwd)
