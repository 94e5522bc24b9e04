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

Matmul-only methods (no LAPACK, no process setting needed, batched natively under ``vmap``),
each with its error bound in its docstring: :func:`gram_top_eigenvalue` (Lanczos, DUST's
``‖D‖²``), :func:`spd_inverse` / :func:`spd_solve` (Newton–Schulz, DUST's dual-frame code),
:func:`clip_eigenvalues_matmul` (the UT's projection: Lanczos deflation of the eigenvalues
past the clip, certified, else Newton–Schulz sign and inverse square root). docs/speed.md
says how their cost is measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "clip_eigenvalues_matmul",
    "eigh",
    "eigvalsh",
    "gram_top_eigenvalue",
    "newton_schulz_resolution",
    "solve",
    "spd_inverse",
    "spd_solve",
]


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


# --------------------------------------------------------------------------------------------------
# Matmul-only methods (no LAPACK): the defaults of the models' per-step linear algebra.
#
# jaxlib's CPU LAPACK kernels run on SciPy's OpenBLAS, whose own thread pool oversubscribes a
# small machine next to XLA's threads unless the process sets OPENBLAS_NUM_THREADS=1, and they
# run serially (a ``lax.map``, above) under ``vmap``. The methods below are matrix products and
# elementwise work only: XLA fuses and threads them itself, batches them under ``vmap``, and
# they run the same whatever the process's settings. Each documents its error bound; tests
# compare them with the exact decompositions (tests/test_linalg.py).
# --------------------------------------------------------------------------------------------------

#: Lanczos steps of :func:`gram_top_eigenvalue` (see its error bound).
LANCZOS_STEPS = 32
_RITZ_SQUARINGS = 20


# Two fixed, generic start vectors (no key needed; constants of the compiled program): a
# low-discrepancy sequence centred on 0 has a non-zero component on every eigenvector of a
# generic matrix, unlike ones(n) (the patch mean), which a structured D may miss. The second
# (another irrational step) starts the clipping's certificate, which must not see only the
# Krylov space the first one spanned.
_START_SEQUENCES = ((0.6180339887498949, 3.0), (0.4142135623730951, 5.0))


def _start_vector(n: int, dtype: Any, which: int = 0) -> jax.Array:
    step, freq = _START_SEQUENCES[which]
    i = jnp.arange(1, n + 1, dtype=jnp.float32)
    v = jnp.mod(i * step, 1.0) - 0.5 + 0.1 * jnp.cos(freq * i)
    return (v / jnp.linalg.norm(v)).astype(dtype)


#: Where a float32 computation is used as it is: ``|x|`` in ``[2^-56, 2^56]`` (its square, and
#: a sum of squares of such, stays inside float32's range).
_PLAIN_EXPONENT = 56


def _exponent(x: jax.Array) -> jax.Array:
    """``e`` with ``|x|`` in ``[2^e, 2^(e+1))`` for a float32 ``x`` (its bits), clipped to
    ±120; a zero gives -120."""
    bits = jax.lax.bitcast_convert_type(jnp.abs(x).astype(jnp.float32), jnp.int32)
    return jnp.clip((bits >> 23) - 127, -120, 120)


def _power_of_two(e: jax.Array) -> jax.Array:
    """``2^e`` in float32, exactly (its bits: ``jnp.ldexp`` goes through a float power), for
    integer ``e`` in [-126, 127]."""
    return jax.lax.bitcast_convert_type((e + 127) << 23, jnp.float32)


def _norm(w: jax.Array) -> jax.Array:
    """``‖w‖₂`` at any scale: the plain norm where ``max |w|`` is in range (the same bits as
    ever), else the norm of ``w`` scaled by a power of two (its square left float32's range:
    an overflow made ``D`` of ‖D‖ ≈ 1e10 a third of its λ_max)."""
    e = _exponent(jnp.max(jnp.abs(w)))
    s = _power_of_two(-e)
    scaled = jnp.linalg.norm(w * s) / s
    return jnp.where(jnp.abs(e) <= _PLAIN_EXPONENT, jnp.linalg.norm(w), scaled)


def _lanczos_basis(
    matvec: Callable[[jax.Array], jax.Array], start: jax.Array, steps: int
) -> jax.Array:
    """``[steps, n]`` orthonormal rows spanning the Krylov space of the symmetric ``matvec``.

    Full re-orthogonalisation, twice (float32 loses it otherwise). Once an invariant subspace
    is found (the new vector only rounding, e.g. ``D Dᵀ = I``), the remaining rows are zero:
    ``Q A Qᵀ`` stays the exact projection on the orthonormal rows, with zero rows and columns.
    """
    basis = jnp.zeros((steps, start.shape[-1]), start.dtype).at[0].set(start)

    def body(i, basis):
        q = jax.lax.dynamic_index_in_dim(basis, i, axis=0, keepdims=False)
        w = matvec(q)
        scale = _norm(w)
        for _ in range(2):
            w = w - (basis @ w) @ basis
        norm = _norm(w)
        found = norm <= 1e-5 * scale
        w = jnp.where(found, 0.0, w / jnp.where(found, 1.0, norm))
        return jax.lax.dynamic_update_index_in_dim(basis, w, i + 1, axis=0)

    return jax.lax.fori_loop(0, steps - 1, body, basis)


def gram_top_eigenvalue(d: jax.Array, steps: int = LANCZOS_STEPS) -> jax.Array:
    """``λ_max(D Dᵀ) = ‖D‖₂²`` for ``d [..., P, K]`` by Lanczos iteration; returns ``[...]``.

    On CPU one matrix at a time (``lax.map`` over leading and ``vmap`` axes, as the LAPACK
    wrappers above): each Lanczos step reads the whole matrix, and a batch of them (runs x
    layers: 8 x 5 x 400 KB) does not stay in cache between steps, one matrix does, so the
    matrices in turn are faster than vmapped.

    Matrix-vector products with ``D`` and ``Dᵀ`` only (the Gram matrix is never formed), from
    a fixed start vector, ``steps`` Lanczos steps with full re-orthogonalisation; the top Ritz
    value (the largest eigenvalue of the ``steps x steps`` projection ``T = Q D Dᵀ Qᵀ``) comes
    from power iteration on ``T`` by 20 repeated squarings (``T^(2^20)``, tiny matrices). No
    derivative (``stop_gradient``).

    Error bound: the result is a Rayleigh quotient, never above the exact value (a lower
    bound). ``D = 0`` gives NaN (its power iteration divides 0 by 0; left so, as guarding it
    moves the rounding of every DUST run: callers that can meet it test ``not ρ > x``), and
    so does ``‖D‖₂`` below about 1e-17; it is finite up to ``‖D‖₂ ≈ 1.8e19``, where ``λ_max``
    leaves float32's range. A norm or a Ritz square out of range is taken again scaled by a
    power of two (exact), beside the plain one, which is kept in range (a scaled ``D`` itself
    changed the compiled rounding of DUST's tied dictionary).
    Lanczos (Kaniel–Paige): ``(λ₁ − θ₁)/(λ₁ − λ_n) ≤ (tan θ₀ / T_{k−1}(1 + 2γ))²``
    with ``T_j`` the Chebyshev polynomial, ``γ = (λ₁ − λ₂)/(λ₂ − λ_n)`` and θ₀ the start's angle
    to the top eigenvector, i.e. exponential in ``k·√γ`` where power iteration is in ``k·γ``;
    the squarings add at most ``1/(2²¹·e) ≈ 1.8e-7`` relative (a Ritz pair closer than that
    is not separated). Accuracy (tests/test_linalg.py): ≤ 3e-7
    relative on the DCT dictionary (λ₂/λ₁ = 0.82) and on dictionaries trained 60 steps, one of
    which has λ₂/λ₁ = 0.988, where 64 power iterations were 3.4e-4 off; ≤ 1e-5 on a DCT
    dictionary under N(0, 0.05²) noise on every element (a random matrix's nearly flat top);
    ≤ 7e-7 at every 20th step of the video setting's 400 (per-layer and tied,
    ``λ₂/λ₁ ≤ 0.97``). Where the top eigenvalues CLUSTER it is looser:
    DUST trained 120 steps on uniform noise reached ``λ₂/λ₁ = 1 − 2e-4``, and 32 steps were up
    to 8.2e-3 below ``λ_max`` there (median 1.8e-5; 48 steps: 1.2e-4). A step size ``1/μ``
    that much too large still converges (ISTA needs ``μ > λ_max/2``). Warm starts carried
    across steps were tried and not adopted (docs/speed.md).
    """
    d = jax.lax.stop_gradient(d).astype(jnp.float32)
    if d.ndim == 2:
        return _lanczos_top(d, steps)
    return _unbatched(lambda m: _lanczos_top(m, steps), (2,))(d)


def _lanczos_top(d: jax.Array, steps: int) -> jax.Array:
    size = d.shape[-2]
    steps = min(steps, size)
    start = _start_vector(size, d.dtype)
    basis = _lanczos_basis(lambda q: d @ (q @ d), start, steps)  # Q [k, P], for D Dᵀ
    qd = basis @ d
    t = qd @ qd.T  # [k, k] = Q D Dᵀ Qᵀ, positive semidefinite
    # T's first square leaves float32's range where its trace is past 2^±56 (‖D‖ ≈ 3e9, or
    # 1e-9): there the squarings start from T scaled by a power of two to trace ≈ 1
    e = _exponent(jnp.trace(t))
    v = jnp.where(
        jnp.abs(e) <= _PLAIN_EXPONENT,
        _ritz_vector(t, steps),
        _ritz_vector(t * _power_of_two(-e), steps),
    )
    return (v @ t @ v) / jnp.sum(v * v)


def _ritz_vector(t: jax.Array, steps: int) -> jax.Array:
    """The top eigenvector of the PSD ``t [k, k]`` (unnormalised): power iteration by repeated
    squaring, each square divided by its trace."""
    m = t
    for _ in range(_RITZ_SQUARINGS):
        m = m @ m
        m = m / jnp.trace(m)
    return m @ _start_vector(steps, t.dtype)


#: Newton–Schulz stops when ``‖I − A X‖_F`` falls below this, then takes one more step.
NEWTON_SCHULZ_TOL = 1e-3
NEWTON_SCHULZ_MAX_ITERATIONS = 40


def spd_inverse(a: jax.Array, lam_max: jax.Array) -> jax.Array:
    """``A⁻¹`` of a symmetric positive definite ``a [..., n, n]`` by Newton–Schulz iteration.

    On CPU one matrix at a time under ``vmap``, as :func:`gram_top_eigenvalue` (the same
    cache argument).

    ``X₀ = I/λ_max``, ``X ← X(2I − A X)``: matrix products only. The residual
    ``R = I − A X`` squares at every step, ``‖R_k‖₂ = (1 − λ_min/λ_max)^(2^k)``, so it
    converges for any SPD ``A`` given ``lam_max`` within a factor 2 of ``λ_max(A)`` from below
    (a power-iteration estimate is). The loop runs until ``‖R‖_F ≤ 1e-3`` and then takes ONE
    more step (``‖R‖_F ≤ 1e-6``, float32's floor for these sizes), at most 40 steps; the
    relative error of the inverse is ``‖A⁻¹ − X‖ ≤ ‖A⁻¹‖·‖R‖``. For DUST's dual frame at init
    (``κ = 2.58``) that is 6 steps, the first elementwise (``X₀`` is a scaled identity).
    """
    a = a.astype(jnp.float32)
    lam_max = jnp.asarray(lam_max, jnp.float32)
    return _spd_inverse_one(a, jnp.broadcast_to(lam_max, a.shape[:-2]))


def _spd_inverse_core(a: jax.Array, lam_max: jax.Array) -> jax.Array:
    n = a.shape[-1]
    eye = jnp.eye(n, dtype=a.dtype)

    def residual(x):
        r = eye - a @ x
        return r, jnp.sqrt(jnp.sum(r * r))

    def cond(carry):
        _, _, norm, i = carry
        return (norm > NEWTON_SCHULZ_TOL) & (i < NEWTON_SCHULZ_MAX_ITERATIONS)

    def body(carry):
        x, r, _, i = carry
        x = x + x @ r
        r, norm = residual(x)
        return x, r, norm, i + 1

    # From X₀ = I/λ the first step X₁ = X₀ + X₀(I − A X₀) = (2I − A/λ)/λ needs no matrix
    # product: it is elementwise (equal to the two products it replaces up to rounding).
    inv_lam = 1.0 / jnp.asarray(lam_max, a.dtype)
    x1 = inv_lam * (2.0 * eye - inv_lam * a)
    r1, n1 = residual(x1)
    x, r, _, _ = jax.lax.while_loop(cond, body, (x1, r1, n1, jnp.int32(1)))
    x = x + x @ r  # the final quadratic step
    return 0.5 * (x + jnp.swapaxes(x, -1, -2))


@jax.custom_vjp
def spd_solve(a: jax.Array, b: jax.Array, lam_max: jax.Array) -> jax.Array:
    """``x = a⁻¹ b`` for SPD ``a [n, n]``, ``b [n, k]``, by :func:`spd_inverse` (no LAPACK).

    ``lam_max``: an estimate of ``λ_max(a)`` (e.g. :func:`gram_top_eigenvalue`). Differentiable
    in ``a`` and ``b`` (the backward pass reuses the inverse: ``∂b = a⁻¹ g``, ``∂a = −∂b xᵀ``);
    ``lam_max`` gets no gradient. Error bound: :func:`spd_inverse`'s.
    """
    return spd_inverse(a, lam_max) @ b


def _spd_solve_fwd(a, b, lam_max):
    inv = spd_inverse(a, lam_max)
    x = inv @ b
    return x, (inv, x, lam_max)


def _spd_solve_bwd(res, g):
    inv, x, lam_max = res
    gb = inv @ g
    return -gb @ jnp.swapaxes(x, -1, -2), gb, jnp.zeros_like(lam_max)


spd_solve.defvjp(_spd_solve_fwd, _spd_solve_bwd)
_spd_inverse_one = _unbatched(_spd_inverse_core, (2, 0))


# Odd quintic of the first sign iterations (the Muon/"Polar Express"-style aggressive step:
# slope 3.44 at 0, maps [0, 1] into [0, 1.21], and [0.2, 1.21] into about [0.68, 1.21]);
# cubic Newton–Schulz steps (x(3 − x²)/2) then converge quadratically to ±1.
_QUINTIC = (3.4445, -4.7750, 2.0315)


def _sign_newton_schulz(x: jax.Array, quintic_steps: int, cubic_steps: int) -> jax.Array:
    """``sign(x)`` of a symmetric ``x [n, n]`` with spectrum inside ``[−1, 1]``."""
    eye = jnp.eye(x.shape[-1], dtype=x.dtype)
    a, b, c = _QUINTIC
    for _ in range(quintic_steps):
        x2 = x @ x
        x = x @ (a * eye + b * x2 + c * (x2 @ x2))
    for _ in range(cubic_steps):
        x = x @ (1.5 * eye - 0.5 * (x @ x))
    return x


#: Relative margin of the skip test of :func:`clip_eigenvalues_matmul`: the clipping is skipped
#: only when the Lanczos estimate of ``‖S‖₂`` (a lower bound) is at most ``(1 − margin)·clip``.
CLIP_SKIP_MARGIN = 1e-3
#: Lanczos steps on ``S`` of the deflation (``method="lanczos"``): its Krylov space, and how
#: many Ritz pairs past the clip it deflates at most (a quarter of it; more: Newton–Schulz).
CLIP_LANCZOS_STEPS = 64
#: Lanczos steps on the deflated matrix of the deflation's certificate (a second start vector).
CLIP_CHECK_STEPS = 32
#: What the deflation resolves: the Ritz values more than ``tol·clip/2`` past the clip are
#: deflated (:func:`_clip_lanczos`).
CLIP_DEFLATION_TOL = 1e-5
#: What ``clip_eigenvalues_matmul(..., return_path=True)`` reports, by index.
CLIP_PATHS = ("skipped", "deflated", "newton_schulz")
# Newton–Schulz steps of the k x k sign functions of the deflation: 3.44^10 resolves a Ritz
# value 3e-6 from the clip (at ‖T‖₂ + c ≈ 2), the cubic steps then converge to float32.
_DEFLATION_SIGN_STEPS = (10, 4)


def clip_eigenvalues_matmul(
    sym: jax.Array,
    clip: float,
    *,
    method: str = "auto",
    quintic_steps: int = 4,
    cubic_steps: int = 4,
    rsqrt_steps: int = 4,
    margin: float = CLIP_SKIP_MARGIN,
    tol: float = CLIP_DEFLATION_TOL,
    accept: float | None = None,
    return_path: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``sym [..., n, n]`` (symmetric) with its eigenvalues clipped to ``[−clip, clip]``, by matmuls.

    No LAPACK: matrix products, Lanczos runs, a bisection on a ``k x k`` tridiagonal matrix and
    ``lax.cond``. Leading axes (and ``vmap`` axes) are run one matrix at a time on CPU
    (``lax.map``, as the LAPACK wrappers above), so each matrix's branches stay real branches;
    elsewhere they are batched natively (the conds become selects: every branch runs, the
    result is the same). ``return_path=True`` also returns, per matrix, which path ran, as an
    index into ``CLIP_PATHS``: 0 skipped, 1 deflated, 2 Newton–Schulz.

    ``method="auto"`` (default): ``"lanczos"`` on CPU, where it is the cheapest of the three
    (below), ``"newton_schulz"`` on GPU/TPU: there Lanczos' 96 matrix-vector steps run one
    after another at kernel latency while a 256x256 product takes microseconds, and under
    ``vmap`` the branches become selects that all run. ``python -m benchmarks gpu`` times
    every method on the device (docs/speed.md).

    ``method="lanczos"``: Lanczos deflation of the eigenvalues past the clip (those more than
    ``tol·clip/2`` past it), returned when a certificate bounds its error by ``accept·clip``
    (Frobenius), else Newton–Schulz; ``accept`` defaults to Newton–Schulz's own resolution at
    the clip, ``½·3.44^(−quintic_steps)`` (3.5e-3 with 4 steps: eigenvalues that close to the
    clip it clips only partly, so falling back there buys no better guarantee); its steps,
    error bound and cost are :func:`_clip_lanczos`'s. ``method="newton_schulz"``: the clipped
    matrix as a product of polynomials in ``sym`` (sign and inverse square root by
    Newton–Schulz), exact to float32 away from the clip; :func:`_clip_one` has its steps and
    error bound. Both skip the clipping, returning ``sym`` bit-exact, when a Lanczos estimate
    of ``‖sym‖₂`` is at most ``(1 − margin)·clip``.
    """
    s = jnp.asarray(sym, jnp.float32)
    if s.ndim < 2 or s.shape[-1] != s.shape[-2]:
        raise ValueError(f"expected square matrices [..., n, n], got {s.shape}")
    if method not in ("auto", "lanczos", "newton_schulz"):
        raise ValueError(f"method must be 'auto', 'lanczos' or 'newton_schulz', got {method!r}")
    if method == "auto":
        method = "lanczos" if _cpu() else "newton_schulz"
    steps = (quintic_steps, cubic_steps, rsqrt_steps)
    if accept is None:
        accept = newton_schulz_resolution(quintic_steps)

    def one(m: jax.Array) -> tuple[jax.Array, jax.Array]:
        if method == "lanczos":
            return _clip_lanczos(m, float(clip), float(margin), (float(tol), float(accept)), steps)
        return _clip_one(m, float(clip), float(margin), steps)

    # always through the custom_vmap rule: under an outer vmap (runs) a 2-D tracer is batched
    out, path = _unbatched(one, (2,))(s)
    return (out, path) if return_path else out


def newton_schulz_resolution(quintic_steps: int = 4) -> float:
    """``δ/c`` within which :func:`_clip_one`'s projector is partial: ``½·3.44^(−quintic_steps)``
    (its error bound: an eigenvalue at least that far from the clip is clipped exactly to
    float32, a closer one lands between itself and the clip)."""
    return 0.5 * _QUINTIC[0] ** -quintic_steps


def _clip_one(
    s: jax.Array, clip: float, margin: float, steps: tuple[int, int, int]
) -> tuple[jax.Array, jax.Array]:
    """``(clipped s, path)`` by ``method="newton_schulz"`` of :func:`clip_eigenvalues_matmul`
    (``S = s``, ``c = clip``): the skip test with :func:`gram_top_eigenvalue` of ``S``
    (``S Sᵀ = S²``, same margin), then, with ``M = S²`` and the projector ``Π = step(M − c²)`` onto the
    eigenvectors of ``|λ| > c``, the clipped matrix is ``S·(I + Π(c·M^(−1/2) − I))``: every
    factor a polynomial in ``S``. ``Π = (I + sign(A))/2`` with ``A = (M − c²I)/ν``
    (``ν = max(1.02ρ² − c², c²)``), the sign by 4 quintic and 4 cubic Newton–Schulz steps;
    ``c·M^(−1/2)`` by Newton's inverse square root from ``I`` (4 steps after a free first one;
    it stays below ``c/|λ|``, so clipped eigenvalues never overshoot ``c``). Error bound, per
    eigenvalue ``λ`` at distance ``δ = ||λ| − c|`` from the boundary: the projector is exact
    to float32 once ``2cδ/ν ≥ 3.44⁻⁴ ≈ 0.007``, i.e. ``δ ≥ 0.0033`` while ``‖S‖₂ ≤ 1.37c``
    (``ν = c²``); closer to the boundary the result lies between ``λ`` and ``c·sign(λ)``, so
    the error is below ``δ``. The inverse square root is exact to ~1e-6 for ``‖S‖₂ ≤ 1.4c``
    (the regime after an optimiser step from a feasible point; with 2 steps, the default until
    the H200 run of 2026-11-30, an eigenvalue at ``1.33c`` came out at ``0.997c`` and the UT's
    layer losses moved 1.2 % from exact clipping after one step); a matrix far past the clip is
    first clipped to ``‖S‖₂/1.3`` until it is in that regime. Cost: 34 ``n x n`` matmuls when
    the clip is active, one Lanczos run (about one matmul) when it is skipped.
    """
    c2 = jnp.float32(clip) ** 2
    rho2 = gram_top_eigenvalue(s)  # max λ² (S Sᵀ = S²), a lower bound
    # not past the margin: skipped. S = 0 (a UT at b = 0 holds W̃_f = 0) makes the estimate
    # 0/0 = NaN, and is skipped too (a NaN S is returned as it is, NaN either way)
    skip = ~(rho2 > jnp.float32((1.0 - margin) * clip) ** 2)
    return jax.lax.cond(
        skip,
        lambda m: (m, jnp.int32(0)),
        lambda m: (_clip_newton_schulz(m, c2, rho2, steps), jnp.int32(2)),
        s,
    )


def _clip_newton_schulz(
    m: jax.Array, c2: jax.Array, rho2: jax.Array, steps: tuple[int, int, int]
) -> jax.Array:
    # Far past the clip (‖S‖₂ > 1.37c: a random init, a large step) the sign's resolution
    # (∝ ν) and the inverse square root's start degrade: first clip to c' = ‖S‖₂/1.3 > c,
    # which lies in the regime, until ‖S‖₂ ≤ 1.37c. It leaves eigenvalues below c' where
    # they are or moves them towards c' (never below c), so the final clip to c is the same.
    def far(carry):
        _, r2, i = carry
        return (r2 > _CLIP_REGIME**2 * c2) & (i < _CLIP_MAX_PASSES)

    def pre_pass(carry):
        m, r2, i = carry
        m = _clip_active(m, r2 / 1.3**2, r2, *steps)
        return m, gram_top_eigenvalue(m), i + 1

    m, r2, _ = jax.lax.while_loop(far, pre_pass, (m, rho2, jnp.int32(0)))
    return _clip_active(m, c2, r2, *steps)


def _lanczos_ritz(
    s: jax.Array, start: jax.Array, steps: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(Q [k, n], Q S [k, n], T = Q S Qᵀ [k, k], Ritz values [k])`` of a symmetric ``s``."""
    from jax.scipy.linalg import eigh_tridiagonal

    basis = _lanczos_basis(lambda q: s @ q, start, steps)
    qs = basis @ s
    t = qs @ basis.T
    t = 0.5 * (t + t.T)
    # T is tridiagonal up to rounding (full re-orthogonalisation): bisection on that part
    theta = eigh_tridiagonal(jnp.diagonal(t), jnp.diagonal(t, 1), eigvals_only=True)
    return basis, qs, t, theta


def _clip_lanczos(
    s: jax.Array,
    clip: float,
    margin: float,
    tols: tuple[float, float],
    steps: tuple[int, int, int],
) -> tuple[jax.Array, jax.Array]:
    """``(clipped s, path)`` by ``method="lanczos"`` of :func:`clip_eigenvalues_matmul`
    (``c = clip``, ``S = sym``, ``(tol, accept) = tols``, by default 1e-5 and 3.5e-3):

    1. Lanczos on ``S`` from a fixed start vector: ``k = 64`` steps with full
       re-orthogonalisation (``Q [k, n]``, orthonormal rows), ``T = Q S Qᵀ`` and its Ritz
       values ``θ_i`` (Sturm bisection on its tridiagonal part,
       ``jax.scipy.linalg.eigh_tridiagonal``, plain jax operations).
    2. Skip: ``ρ = max|θ_i|`` is a lower bound of ``‖S‖₂``; when ``ρ ≤ (1 − margin)·c``
       (``margin`` 1e-3) ``sym`` is returned bit-exact. The skip is wrong only if Lanczos
       underestimates ``‖S‖₂`` by more than the margin: bounded by Kaniel–Paige (see
       :func:`gram_top_eigenvalue`), unbounded for a matrix whose top eigenvector is (nearly)
       orthogonal to the start vector. Without the margin a matrix just past the clip whose
       estimate falls just short of it would be returned unclipped (tests/test_linalg.py).
    3. Deflation: ``S' = S − Σ (θ_i − c·sign θ_i) u_i u_iᵀ`` over the Ritz pairs with
       ``|θ_i| > e = (1 + tol/2)·c``, ``u_i = Qᵀ y_i`` the Ritz vectors, computed as
       ``S − Qᵀ g(T) Q`` with ``g(T) = (T − cI)·step(T − eI) + (T + cI)·step(−T − eI)``, the
       steps by Newton–Schulz signs of ``(T ∓ eI)/(1.01ρ + e)`` (10 quintic and 4 cubic steps
       on ``k x k`` matrices: exact to float32 for Ritz values at least ~3e-6 from ``±e``,
       partial closer to it). Eigenvalues less than ``tol·c/2`` past the clip are left where
       they are: a Krylov space holds one direction of a cluster, and eigenvalues sit in a
       cluster at the clip after every projection. More than ``k/4`` Ritz pairs to deflate:
       Newton–Schulz instead (the Krylov space cannot hold so many eigenvectors accurately).
    4. Certificate, else Newton–Schulz on ``S`` (:func:`_clip_one`'s, its skip estimate
       replaced by ``ρ``): ``S'`` is returned only if (a) the residual of the
       deflated Ritz pairs, ``r = ‖(S Qᵀ − Qᵀ T) Π‖_F`` (``Π = step(|T| − eI)``; computed
       explicitly, so it includes the rounding of the Lanczos recurrence), satisfies
       ``2√2·r ≤ accept·c``, and (b) a second Lanczos run (32 steps) on ``S'`` from another
       start vector estimates ``‖S'‖₂ ≤ (1 + accept)·c``. (b) is what catches eigenvectors
       that the first Krylov space missed (tests/test_linalg.py). ``accept`` is
       Newton–Schulz's resolution at the clip (3.5e-3): a cluster of eigenvalues that close to
       the clip, which one Krylov space cannot separate, Newton–Schulz clips only partly too
       (measured on the video training's failures at ``accept = tol``: 2.3e-4 of ``c`` from
       the exact clipping, Frobenius, against the deflation's 2.8e-4, for 34 ``n x n``
       products), so it runs only where the deflation's bound is wider than that.

    Error bound of a deflated result. Let ``U`` hold the deflated Ritz vectors, ``B`` the
    compression of ``S`` onto their orthogonal complement and ``Ŝ`` the matrix ``S`` without
    the coupling ``(I − UUᵀ) S U`` between them (``‖S − Ŝ‖_F = √2·r``). ``span U`` is invariant
    under ``Ŝ``, so ``clip(Ŝ) = S' − (S − Ŝ) − g(B)`` (``g(B) = B − clip(B)`` on the
    complement), and the clipping, the Frobenius projection onto ``{‖X‖₂ ≤ c}``, is
    1-Lipschitz in the Frobenius norm: ``‖S' − clip(S)‖_F ≤ 2√2·r + ‖g(B)‖_F ≤ accept·c +
    ‖g(B)‖_F``, with no assumption on eigenvalue gaps. ``g(B)`` holds the eigenvalues past
    the clip that were not deflated; each is at most ``‖S'‖₂ − c``, which (b) bounds by
    ``accept·c`` if the second Lanczos estimate is accurate to it: a lower bound, so this part
    is an estimate of the same kind as the skip test's, not a proof (the deflation's own part
    is). The signs' resolution adds ≤ 3e-6 per Ritz value within it of ``±e``. Against
    ``eigh`` (tests/test_linalg.py): ≤ 4.2e-7 max abs on 160 matrices of the video training
    whose deflation the bound at ``tol`` certifies, ≤ 1e-6 on synthetic spectra it deflates;
    on the 300 of one default run's UT training that it does not (clusters at the clip; 84 %
    of them within ``accept``): 2.8e-4 of ``c`` (median, Frobenius), 9.1e-4 at most, 1.2e-5
    max abs. A fallback result has Newton–Schulz's bound (:func:`_clip_one`).

    Cost: a 64-step and a 32-step Lanczos run (one matrix-vector product a step), ``n x k``
    products, about 90 ``k x k`` products and a bisection, against Newton–Schulz's 34 ``n x n``
    products: for ``n = 256`` on a CPU it takes less time than either Newton–Schulz or ``eigh``
    (docs/speed.md); a fallback pays the deflation attempt and Newton–Schulz.

    """
    n = s.shape[-1]
    k = min(CLIP_LANCZOS_STEPS, n)
    c = jnp.float32(clip)
    basis, qs, t, theta = _lanczos_ritz(s, _start_vector(n, s.dtype), k)
    rho = jnp.max(jnp.abs(theta))  # a lower bound of ‖S‖₂
    # Ritz values within tol·c/2 past the clip are left: a Krylov space resolves a cluster at
    # the clip (where the previous step's clipping put the eigenvalues) only to about its width
    tol, _ = tols
    num_deflated = jnp.sum(jnp.abs(theta) > (1.0 + 0.5 * tol) * c)
    path = jnp.where(rho <= (1.0 - margin) * c, 0, jnp.where(num_deflated > k // 4, 2, 1))

    def newton_schulz(m):
        return _clip_newton_schulz(m, c**2, rho**2, steps), jnp.int32(2)

    def deflated(m):
        out, certified = _deflate(m, basis, qs, t, rho, num_deflated, c, tols)
        return jax.lax.cond(certified, lambda m: (out, jnp.int32(1)), newton_schulz, m)

    return jax.lax.switch(path, (lambda m: (m, jnp.int32(0)), deflated, newton_schulz), s)


def _deflate(
    s: jax.Array,
    basis: jax.Array,
    qs: jax.Array,
    t: jax.Array,
    rho: jax.Array,
    num_deflated: jax.Array,
    c: jax.Array,
    tols: tuple[float, float],
) -> tuple[jax.Array, jax.Array]:
    """``(S − Qᵀ g(T) Q, certified)``: see :func:`_clip_lanczos`, steps 3 and 4."""
    tol, accept = tols
    k, n = basis.shape
    eye = jnp.eye(k, dtype=t.dtype)
    edge = (1.0 + 0.5 * tol) * c  # deflate the Ritz pairs with |θ| > edge
    sign_scale = 1.01 * rho + edge  # ≥ ‖T ∓ edge·I‖₂
    signs = _sign_newton_schulz(
        jnp.stack([t - edge * eye, t + edge * eye]) / sign_scale, *_DEFLATION_SIGN_STEPS
    )
    above, below = eye + signs[0], eye - signs[1]  # 2·step(T − edge), 2·step(−T − edge)
    excess = 0.5 * ((t - c * eye) @ above + (t + c * eye) @ below)  # T − clip(T), there
    excess = 0.5 * (excess + excess.T)
    proj = 0.5 * (above + below)  # Π, onto the deflated Ritz vectors
    residual = jnp.linalg.norm((qs.T - basis.T @ t) @ proj)  # ‖(S Qᵀ − Qᵀ T) Π‖_F
    out = s - basis.T @ (excess @ basis)
    out = jnp.where(num_deflated > 0, 0.5 * (out + out.T), s)
    theta = _lanczos_ritz(out, _start_vector(n, s.dtype, 1), min(CLIP_CHECK_STEPS, n))[3]
    certified = (2.0 * 2.0**0.5 * residual <= accept * c) & (
        jnp.max(jnp.abs(theta)) <= (1.0 + accept) * c
    )
    return out, certified


_CLIP_REGIME = 1.37  # ‖S‖₂ / c up to which one pass of _clip_active is accurate
_CLIP_MAX_PASSES = 64  # ‖S‖₂ / c up to 1.3^64 ≈ 2e7


def _clip_active(
    s: jax.Array,
    c2: jax.Array,
    rho2: jax.Array,
    quintic_steps: int,
    cubic_steps: int,
    rsqrt_steps: int,
) -> jax.Array:
    eye = jnp.eye(s.shape[-1], dtype=s.dtype)
    m = s @ s
    nu = jnp.maximum(1.02 * rho2 - c2, c2)  # rho2 is a lower bound: pad it
    proj = 0.5 * (eye + _sign_newton_schulz((m - c2 * eye) / nu, quintic_steps, cubic_steps))
    z = m / c2
    # Newton for z^(−1/2) from y₀ = I·min(1, √(2/z_max)), inside its basin (z·y₀² < 3)
    y0 = jnp.minimum(1.0, jnp.sqrt(2.0 * c2 / (1.02 * rho2)))
    y = y0 * (1.5 * eye - 0.5 * y0**2 * z)
    for _ in range(rsqrt_steps):
        y = 0.5 * y @ (3.0 * eye - z @ (y @ y))
    out = s @ (eye + proj @ (y - eye))
    return 0.5 * (out + jnp.swapaxes(out, -1, -2))
