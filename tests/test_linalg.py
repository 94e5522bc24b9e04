"""cudt.linalg: same values and gradients as jnp.linalg, and never a batched LAPACK call on CPU.

The batched-call check is structural (the compiled HLO), not a timing or a hang test: jaxlib
0.10's batched CPU LAPACK calls can deadlock each other (see cudt/linalg.py), so under ``vmap``
every ``lapack_*`` custom call must see a single matrix.
"""

from __future__ import annotations

import functools
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


@pytest.mark.slow
def test_models_under_vmap_emit_only_unbatched_lapack_calls():
    x = jnp.zeros((2, 3, 256))
    for method in ("lapack", "matmul"):
        dust = DUST(num_layers=2, linalg=method)
        params = jax.vmap(lambda k, m=dust: m.init(k, x))(jax.random.split(jax.random.key(0), 2))

        def dust_loss(p, m=dust):
            return jnp.mean(m.apply(p, x)[0] ** 2)

        ranks = _lapack_operand_ranks(jax.vmap(jax.grad(dust_loss)), params)
        if method == "lapack":
            assert ranks and set(ranks) == {2}, ranks
        else:  # the default: no LAPACK call at all in the step
            assert ranks == [], ranks

    ut = UT(num_layers=2, dim=16)
    ut_params = jax.vmap(lambda k: ut.init(k, jnp.zeros((2, 3, 16))))(
        jax.random.split(jax.random.key(1), 3)
    )
    ranks = _lapack_operand_ranks(jax.vmap(ut_project), ut_params)
    assert ranks == [], ranks  # the default clipping: no LAPACK call at all
    exact = functools.partial(ut_project, method="eigh")
    ranks = _lapack_operand_ranks(jax.vmap(exact), ut_params)
    assert ranks and set(ranks) == {2}, ranks


# ----------------------------------------------------------------------------- matmul-only methods


def _dct_like(seed: int, layers: int = 3, noise: float = 0.0) -> jax.Array:
    from cudt.models.dct import dct2_dictionary

    d = np.broadcast_to(dct2_dictionary(16, 20), (layers, 256, 400)).astype(np.float32)
    return jnp.asarray(d + noise * np.random.default_rng(seed).normal(size=d.shape))


def _exact_top(d) -> np.ndarray:
    d64 = np.asarray(d, np.float64)
    return np.linalg.eigvalsh(np.einsum("...pk,...qk->...pq", d64, d64))[..., -1]


@pytest.mark.parametrize(("noise", "rtol"), [(0.0, 1e-6), (0.01, 1e-6), (0.05, 3e-5)])
def test_gram_top_eigenvalue_matches_eigvalsh_and_is_a_lower_bound(noise, rtol):
    # noise 0.05 on every element buries the DCT under a random matrix whose top eigenvalues
    # are nearly equal (the documented worst case: 32 steps do not separate them fully)
    d = _dct_like(0, noise=noise)
    ours = np.asarray(jax.jit(linalg.gram_top_eigenvalue)(d), np.float64)
    exact = _exact_top(d)
    np.testing.assert_allclose(ours, exact, rtol=rtol)
    assert np.all(ours <= exact * (1 + 1e-6))  # a Rayleigh quotient: never above
    # the exact LAPACK path agrees too (the option DUST(linalg="lapack") uses)
    np.testing.assert_allclose(
        linalg.eigvalsh(jnp.einsum("lpk,lqk->lpq", d, d))[..., -1], exact, rtol=1e-5
    )


def test_gram_top_eigenvalue_degenerate_and_vmapped():
    eye = jnp.eye(8, 12)  # D Dᵀ = I: the Lanczos basis stops growing after one step
    np.testing.assert_allclose(linalg.gram_top_eigenvalue(eye), 1.0, rtol=1e-6)
    d = _dct_like(1, layers=2, noise=0.02)
    np.testing.assert_allclose(jax.vmap(linalg.gram_top_eigenvalue)(d), _exact_top(d), rtol=1e-6)
    # S = 0 (a UT at b = 0 holds W̃_f = 0 for good): every method returns it as it is
    zero = jnp.zeros((16, 16))
    for method in ("lanczos", "newton_schulz"):
        out = linalg.clip_eigenvalues_matmul(zero, 0.95, method=method)
        np.testing.assert_array_equal(out, zero)


@pytest.mark.parametrize("power", [-40, -20, 20, 40])
def test_gram_top_eigenvalue_at_any_scale_is_the_unit_scale_times_its_square(power):
    # ‖D‖ ≈ 3e9 gave NaN (T's squarings overflowed), 1e10 a third of λ_max (the Lanczos norms
    # did) and 1e-12 NaN (both underflowed); a power of two scales λ_max by its square (to the
    # last bit where no product is subnormal: ±20 here)
    d = _dct_like(3, layers=1, noise=0.02)[0]
    top = linalg.gram_top_eigenvalue(d)
    scaled = linalg.gram_top_eigenvalue(d * 2.0**power)
    np.testing.assert_allclose(scaled, top * 2.0 ** (2 * power), rtol=1e-6)
    np.testing.assert_allclose(scaled, _exact_top(d * 2.0**power), rtol=1e-6)
    if abs(power) == 20:
        np.testing.assert_array_equal(scaled, top * 2.0 ** (2 * power))


def test_spd_solve_matches_solve_values_and_gradients():
    d = _dct_like(2, layers=1, noise=0.02)[0]
    gram = d @ d.T
    lam = linalg.gram_top_eigenvalue(d)
    ref = np.linalg.solve(np.asarray(gram, np.float64), np.asarray(d, np.float64))
    ours = np.asarray(linalg.spd_solve(gram, d, lam))
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-5
    # residual of the inverse, the documented bound
    inv = linalg.spd_inverse(gram, lam)
    assert float(jnp.linalg.norm(jnp.eye(256) - gram @ inv)) < 1e-4

    def loss(solver, dd):
        return jnp.sum(jnp.sin(solver(dd @ dd.T, dd)))

    g_ours = jax.grad(lambda dd: loss(lambda a, b: linalg.spd_solve(a, b, lam), dd))(d)
    g_ref = jax.grad(lambda dd: loss(linalg.solve, dd))(d)
    np.testing.assert_allclose(g_ours, g_ref, rtol=1e-3, atol=1e-4 * float(jnp.abs(g_ref).max()))


def test_spd_inverse_converges_for_an_ill_conditioned_matrix():
    q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(64, 64)))
    a = jnp.asarray((q * np.geomspace(1e-3, 1.0, 64)) @ q.T, jnp.float32)  # κ = 1000
    inv = linalg.spd_inverse(a, jnp.float32(1.0))
    ref = np.linalg.inv(np.asarray(a, np.float64))
    assert np.abs(np.asarray(inv) - ref).max() / np.abs(ref).max() < 1e-3


@pytest.mark.slow
def test_dust_matmul_matches_lapack_at_init_and_through_training():
    """Both DUST linear-algebra methods train the same: same states at init, then 8 constrained
    steps of each, with μ and the dual code checked against the exact ones on the way."""
    import optax

    import cudt
    from cudt.models.dust import spectral_norm_sq

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0, 1, size=(4, 3, 256)), jnp.float32)
    # compiled once: called eagerly, each call traced and compiled the Lanczos run anew
    norm_sq = jax.jit(spectral_norm_sq, static_argnums=1)
    runs = {}
    for method in ("matmul", "lapack"):
        model = DUST(num_layers=2, per_layer_dictionary=True, linalg=method)
        params = model.init(jax.random.key(0), x)

        def losses(p, batch, key, m=model):
            noisy = batch + 0.1 * jax.random.normal(key, batch.shape)
            _, states = m.apply(p, noisy)
            return jnp.mean((states - batch[None]) ** 2, axis=(2, 3)).T

        init, step = cudt.make_train_step(
            losses, optax.adam(1e-2), cudt.dual_ascent(1e-1), cudt.DescentConfig(2, epsilon=0.1)
        )
        runs[method] = [init(params), step, model, []]
    for _ in range(8):
        for run in runs.values():
            run[0], metrics = run[1](run[0], x, jax.random.key(1))
            run[3].append(np.asarray(metrics["layer_loss"]))
        d = runs["matmul"][0].params["params"]["dictionary"]  # trained by the matmul path
        # equal_nan=False: a diverged run (NaN dictionaries) must not pass as "equal"
        np.testing.assert_allclose(
            norm_sq(d, "power"), norm_sq(d, "eigh"), rtol=1e-5, equal_nan=False
        )
    moved = float(
        jnp.abs(d - runs["lapack"][2].init(jax.random.key(0), x)["params"]["dictionary"]).max()
    )
    assert moved > 1e-2  # the dictionaries did train (lr 1e-2, 8 Adam steps)
    # the trained dictionary's states agree with the exact method's on the same params
    params = runs["matmul"][0].params
    s_mm = runs["matmul"][2].apply(params, x)[1]
    s_ex = runs["lapack"][2].apply(params, x)[1]
    np.testing.assert_allclose(s_mm, s_ex, rtol=1e-4, atol=1e-5)
    # and the two trainings stay together. Adam's sign-like steps amplify the methods' ~1e-6
    # rounding differences: 8 steps left up to 2.9e-3 relative on one machine (2e-4 on another),
    # so 2e-2 here (the methods themselves are held to 1e-5 and 1e-4 above).
    np.testing.assert_allclose(runs["matmul"][3], runs["lapack"][3], rtol=2e-2)


# Jitted once for the module: the parametrised cases share a shape, so each compiles once
# (the clipping's Lanczos, deflation and fallback branches take seconds to compile).
_clip_with_path = jax.jit(
    lambda m, clip: linalg.clip_eigenvalues_matmul(m, clip, return_path=True),
    static_argnums=1,
)
_project_ffn = jax.jit(lambda tree: ut_project(tree)["ffn"])


def _spectrum_matrix(eigenvalues, seed: int = 0) -> jax.Array:
    n = len(eigenvalues)
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return jnp.asarray((q * np.asarray(eigenvalues)) @ q.T, jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("eigenvalues", "tol"),
    [
        # the UT mid-training (measured): 12 of 256 eigenvalues up to 0.14 below −0.95
        (np.r_[np.linspace(-1.09, -0.96, 12), np.linspace(-0.95, -0.886, 116)], 5e-5),
        # eigenvalues from 1e-5 to 0.1 outside, the rest inside up to 0.5
        (np.r_[-0.95 - np.geomspace(1e-5, 0.1, 20), np.linspace(-0.94, 0.5, 108)], 1e-4),
        # both sides, ‖S‖ = 1.37·clip
        (np.linspace(-1.3, 1.3, 128), 2e-3),
        # far past the clip (‖S‖ = 3.2·clip, a random init): pre-passes to c' = ‖S‖/1.3 first
        (np.linspace(-3.0, 3.0, 128), 2e-3),
    ],
)
def test_clip_eigenvalues_matmul_matches_eigh(eigenvalues, tol):
    s = _spectrum_matrix(eigenvalues)
    ours = np.asarray(_clip_with_path(s, 0.95)[0], np.float64)
    w, v = np.linalg.eigh(np.asarray(s, np.float64))
    exact = (v * np.clip(w, -0.95, 0.95)) @ v.T
    assert np.abs(ours - exact).max() < tol
    evals = np.linalg.eigvalsh(ours)
    assert evals.min() >= -0.95 - 2e-4 and evals.max() <= 0.95 + 2e-4
    # the same through ut_project, stacked runs included
    tree = {"attn": jnp.eye(128), "ffn": jnp.stack([s, s]), "bias": jnp.zeros(128)}
    out = _project_ffn(tree)  # the default method
    np.testing.assert_allclose(out[1], ours, atol=1e-5)


def test_clip_newton_schulz_clips_exactly_after_an_optimiser_step():
    """The GPU's method on the spectrum one Adam step leaves (measured on the UT of
    ``python -m benchmarks step`` on an H200): one eigenvalue pushed to 1.33x the clip, a
    cluster inside. Two inverse-square-root steps (the default until 2026-11-30) left it at
    0.997x the clip, a spectral error of 3e-3, and the UT's layer losses 1.2 % from exact
    clipping after one step."""
    n, c = 128, 0.95
    s = _spectrum_matrix(
        np.r_[-1.33 * c, np.full(40, 0.75 * c), np.linspace(-0.9, 0.9, n - 41) * c]
    )
    ours, path = linalg.clip_eigenvalues_matmul(s, c, method="newton_schulz", return_path=True)
    assert linalg.CLIP_PATHS[int(path)] == "newton_schulz"
    w, v = np.linalg.eigh(np.asarray(s, np.float64))
    exact = (v * np.clip(w, -c, c)) @ v.T
    assert np.linalg.norm(np.asarray(ours, np.float64) - exact, 2) < 2e-5


@pytest.mark.slow
def test_clip_eigenvalues_matmul_leaves_feasible_unchanged():
    s = _spectrum_matrix(np.linspace(-0.9, 0.9, 64))
    np.testing.assert_array_equal(linalg.clip_eigenvalues_matmul(s, 0.95), s)


def test_clip_skip_keeps_a_margin():
    """The skip test compares a LOWER bound of ‖S‖₂ with the clip, so it needs a margin. Here the
    Lanczos start vector is an eigenvector (eigenvalue −0.9497, inside the clip): the estimate
    stops there and misses the eigenvalue −0.96 orthogonal to it. Without the margin the matrix
    is returned unclipped; with the default margin (1e-3) it is clipped."""
    n = 64
    start = np.asarray(linalg._start_vector(n, jnp.float32), np.float64)
    q, _ = np.linalg.qr(np.c_[start, np.random.default_rng(0).normal(size=(n, n - 1))])
    s = _spectrum_matrix_from(q, np.r_[-0.9497, -0.96, np.linspace(-0.9, 0.5, n - 2)])
    assert float(linalg.gram_top_eigenvalue(s)) < 0.95**2  # the estimate is short of the clip
    no_margin = linalg.clip_eigenvalues_matmul(s, 0.95, margin=0.0)
    np.testing.assert_array_equal(no_margin, s)  # skipped: wrong
    evals = np.linalg.eigvalsh(np.asarray(ut_project({"attn": s, "ffn": s, "bias": s[0]})["ffn"]))
    assert evals.min() >= -0.95 - 1e-5, evals.min()


def _spectrum_matrix_from(q: np.ndarray, eigenvalues) -> jax.Array:
    return jnp.asarray((q * np.asarray(eigenvalues)) @ q.T, jnp.float32)


@pytest.mark.slow
def test_default_clip_vmapped_runs_some_active_some_not():
    """Runs stacked by vmap, one feasible (returned bit-exact), one past the clip and one far past
    it; on CPU each run keeps its own branch (a conditional in the compiled program)."""
    spectra = [
        np.linspace(-0.9, 0.9, 128),
        np.r_[np.linspace(-1.09, -0.96, 12), np.linspace(-0.95, -0.886, 116)],
        np.linspace(-3.0, 3.0, 128),
    ]
    ffn = jnp.stack([_spectrum_matrix(e, seed) for seed, e in enumerate(spectra)])
    tree = {"attn": ffn, "ffn": ffn, "bias": ffn[:, 0]}
    project = jax.jit(jax.vmap(ut_project))
    out = np.asarray(project(tree)["ffn"], np.float64)
    np.testing.assert_array_equal(out[0], ffn[0])
    for run in (1, 2):
        w, v = np.linalg.eigh(np.asarray(ffn[run], np.float64))
        exact = (v * np.clip(w, -0.95, 0.95)) @ v.T
        assert np.abs(out[run] - exact).max() < 2e-3, run
        assert np.abs(np.linalg.eigvalsh(out[run])).max() <= 0.95 + 2e-4
    if jax.default_backend() == "cpu":
        assert "conditional(" in jax.jit(jax.vmap(ut_project)).lower(tree).compile().as_text()
    # each run took its own path: skipped, deflated (12 past the clip), Newton–Schulz (64 past)
    clip = jax.jit(jax.vmap(lambda m: linalg.clip_eigenvalues_matmul(m, 0.95, return_path=True)))
    _, paths = clip(0.5 * (ffn + jnp.swapaxes(ffn, -1, -2)))
    assert [linalg.CLIP_PATHS[int(p)] for p in paths] == ["skipped", "deflated", "newton_schulz"]
    # Newton–Schulz stays reachable as an explicit method, vmapped too
    ns = jax.jit(jax.vmap(functools.partial(ut_project, method="newton_schulz")))(tree)["ffn"]
    np.testing.assert_array_equal(ns[0], ffn[0])
    np.testing.assert_allclose(ns[1:], out[1:], atol=2e-3)


def _ut_training(lr: float, project, steps: int = 8, dim: int = 32):
    import optax

    import cudt

    x = jnp.asarray(np.random.default_rng(0).uniform(0, 1, size=(4, 6, dim)), jnp.float32)
    model = UT(num_layers=2, dim=dim)
    params = model.init(jax.random.key(0), x)

    def losses(p, batch, key):
        _, states = model.apply(p, batch + 0.2 * jax.random.normal(key, batch.shape))
        return jnp.mean((states - batch[None]) ** 2, axis=(2, 3)).T

    init, step = cudt.make_train_step(
        losses,
        optax.adam(lr),
        cudt.dual_ascent(1e-1),
        cudt.DescentConfig(2, epsilon=0.1),
        project_params=project,
    )
    state, trace = init(params), []
    for _ in range(steps):
        state, metrics = step(state, x, jax.random.key(1))
        trace.append(np.asarray(metrics["layer_loss"]))
    return np.asarray(trace), state.params


@pytest.mark.slow
def test_ut_project_default_tracks_eigh_through_training():
    """UT training with the default projection and with eigh: the same losses step after step
    (8 Adam steps at a learning rate, 1e-2, that pushes W̃_f's eigenvalues past the clip, so
    both clip every step)."""
    exact = functools.partial(ut_project, method="eigh")
    traces, clipped = {}, {}
    for name, project in (("eigh", exact), ("default", ut_project)):
        traces[name], params = _ut_training(1e-2, project)
        clipped[name] = np.linalg.eigvalsh(np.asarray(params["params"]["ffn"], np.float64))
    assert np.isclose(clipped["eigh"].min(), -0.95, atol=1e-5)  # the clip was active
    assert clipped["default"].min() >= -0.95 - 2e-4
    np.testing.assert_allclose(traces["default"], traces["eigh"], rtol=2e-3)


@pytest.mark.slow
def test_ut_project_default_inactive_clip_is_the_identity_through_training():
    """At a learning rate (1e-4) that keeps W̃_f's eigenvalues inside the clip (‖S‖₂ ≈ 0.9), the
    default skips the clipping: it returns the trained parameters bit-exact, and the training
    is eigh's (which returns a feasible matrix bit-exact) up to float32 rounding. Not bit for
    bit: the two steps are two compiled programs, whose code generators may round the same
    gradients in another order (1 ulp here with XLA:CPU's legacy emitters, 0 with its new)."""
    exact = functools.partial(ut_project, method="eigh")
    trace_eigh, params_eigh = _ut_training(1e-4, exact)
    trace, params = _ut_training(1e-4, ut_project)
    ffn = np.asarray(params["params"]["ffn"], np.float64)
    assert np.abs(np.linalg.eigvalsh(ffn)).max() < 0.94  # inactive all along
    projected = jax.jit(ut_project)(params)
    for a, b in zip(jax.tree.leaves(projected), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(trace, trace_eigh, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params_eigh), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_ut_project_default_deflates_through_training_at_full_width():
    """The same at the video model's width (256 > the 64-step Krylov space) and learning rate
    (1e-3): the default deflates the Ritz pairs past the clip at every step (no fallback) and
    the losses stay with eigh's; init's projection of the feasible start skips the clipping."""
    paths = []

    def project(params):
        ffn = params["params"]["ffn"]
        _, path = linalg.clip_eigenvalues_matmul(0.5 * (ffn + ffn.T), 0.95, return_path=True)
        jax.debug.callback(lambda p: paths.append(int(p)), path)
        return ut_project(params)

    trace, params = _ut_training(1e-3, project, dim=256)
    trace_eigh, _ = _ut_training(1e-3, functools.partial(ut_project, method="eigh"), dim=256)
    # init projects the feasible starting point (skipped), then every step deflates
    assert [linalg.CLIP_PATHS[p] for p in paths] == ["skipped"] + ["deflated"] * 8
    evals = np.linalg.eigvalsh(np.asarray(params["params"]["ffn"], np.float64))
    assert evals.min() < -0.95 + 1e-5 and np.abs(evals).max() <= 0.95 * (1 + 1e-5)
    np.testing.assert_allclose(trace, trace_eigh, rtol=2e-3)


# ------------------------------------------------------- the default clipping: Lanczos deflation

_C = 0.95
# The video UT's W̃_f before its projection at step 395 of the default training (measured):
# 10 eigenvalues past the clip by these amounts, 4 just inside, a tail and a tight bulk.
_TRAINING_EXCESS = np.array(
    [0.126, 4.0e-3, 2.3e-3, 1.15e-3, 8.8e-4, 5.1e-4, 3.1e-4, 2.3e-4, 1e-4, 4e-5]
)
_TRAINING = np.r_[
    -_C - _TRAINING_EXCESS,
    [-0.9496, -0.9493, -0.9473, -0.9454],
    np.linspace(-0.945, -0.895, 25),
    np.linspace(-0.892, -0.8837, 217),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("eigenvalues", "path", "tol"),
    [
        (_TRAINING, "deflated", 1e-6),
        # the same with one eigenvalue 1.4e-6 past the clip (the smallest excess measured)
        (np.r_[_TRAINING[:-1], -_C - 1.4e-6], "deflated", 2e-6),
        # past the clip on both sides, two clusters inside
        (
            np.r_[
                -_C - np.array([0.1, 0.01, 1e-3]),
                _C + np.array([0.2, 0.02, 2e-4]),
                np.linspace(-0.5, -0.45, 125),
                np.linspace(0.3, 0.35, 125),
            ],
            "deflated",
            1e-6,
        ),
        # a cluster of width 4e-6 straddling the clip: one Krylov space holds one direction of
        # it, the rest stays within the band tol·c/2 past the clip that the deflation leaves
        (
            np.r_[_C + np.linspace(-2e-6, 2e-6, 9), -1.0, np.linspace(-0.5, 0.5, 246)],
            "deflated",
            5e-6,
        ),
        # far past, a few: deflation does not care how far
        (np.r_[-2.5, 1.8, np.linspace(-0.9, 0.9, 254)], "deflated", 1e-6),
        # a spread spectrum: 20 past the clip by 1e-5..0.1 next to a continuum inside
        (
            np.r_[-_C - np.geomspace(1e-5, 0.1, 20), np.linspace(-0.94, 0.5, 236)],
            "newton_schulz",
            1e-4,
        ),
        # more past the clip (40) than the Krylov space can deflate (k/4 = 16)
        (
            np.r_[-_C - np.linspace(1e-3, 0.2, 40), np.linspace(-0.9, 0.9, 216)],
            "newton_schulz",
            1e-4,
        ),
    ],
)
def test_clip_deflation_matches_eigh_or_falls_back(eigenvalues, path, tol):
    s = _spectrum_matrix(eigenvalues)
    out, taken = _clip_with_path(s, _C)
    assert linalg.CLIP_PATHS[int(taken)] == path
    w, v = np.linalg.eigh(np.asarray(s, np.float64))
    exact = (v * np.clip(w, -_C, _C)) @ v.T
    assert np.abs(np.asarray(out, np.float64) - exact).max() < tol
    evals = np.linalg.eigvalsh(np.asarray(out, np.float64))
    slack = _C * linalg.CLIP_DEFLATION_TOL if path == "deflated" else 2e-4
    assert np.abs(evals).max() <= _C + slack
    # ut_project's default is this clipping (of the symmetric part: to rounding)
    projected = _project_ffn({"attn": s, "ffn": s, "bias": s[0]})
    np.testing.assert_allclose(projected, out, atol=tol)


# A cluster of width 2e-4 straddling the clip, one eigenvalue far past, a spread bulk inside
_CLUSTER_AT_THE_CLIP = np.r_[_C + np.linspace(-1e-4, 1e-4, 9), -1.0, np.linspace(-0.5, 0.5, 246)]


@pytest.mark.slow
def test_clip_deflation_kept_for_a_cluster_newton_schulz_cannot_resolve_either():
    """One Krylov space cannot separate a cluster at the clip: its Ritz residuals are too large
    for a certificate at ``tol`` (``accept=tol``: the fallback, Newton–Schulz), but within
    ``accept``, Newton–Schulz's own resolution at the clip, where it clips partly too: the
    deflation is kept, within ``accept·c`` of the exact clipping, and no less exact than the
    fallback it saves (34 n x n products)."""
    accept = linalg.newton_schulz_resolution()
    assert 3.4e-3 < accept < 3.6e-3  # ½·3.44⁻⁴: 4 quintic steps
    s = _spectrum_matrix(_CLUSTER_AT_THE_CLIP)
    w, v = np.linalg.eigh(np.asarray(s, np.float64))
    exact = (v * np.clip(w, -_C, _C)) @ v.T

    def error(out):
        return np.linalg.norm(np.asarray(out, np.float64) - exact)

    out, taken = _clip_with_path(s, _C)
    strict, strict_taken = linalg.clip_eigenvalues_matmul(
        s, _C, accept=linalg.CLIP_DEFLATION_TOL, return_path=True
    )
    assert linalg.CLIP_PATHS[int(taken)] == "deflated"
    assert linalg.CLIP_PATHS[int(strict_taken)] == "newton_schulz"
    assert error(out) <= accept * _C and error(out) <= error(strict)
    evals = np.linalg.eigvalsh(np.asarray(out, np.float64))
    assert np.abs(evals).max() <= _C * (1 + accept)
    assert evals.min() <= -_C + 1e-5  # the eigenvalue at −1.0 is clipped exactly


def test_clip_deflation_falls_back_on_a_random_init():
    """A xavier-uniform W̃_f (the text classifier's init): ‖S‖₂ ≈ 1.5·clip with ~54 of 256
    eigenvalues past it, on a continuum: Newton–Schulz, with its far-past pre-passes."""
    rng = np.random.default_rng(5)
    w = rng.uniform(-np.sqrt(6 / 512), np.sqrt(6 / 512), size=(256, 256))
    s = jnp.asarray(0.5 * (w + w.T), jnp.float32)
    out, taken = _clip_with_path(s, _C)
    assert linalg.CLIP_PATHS[int(taken)] == "newton_schulz"
    ev, v = np.linalg.eigh(np.asarray(s, np.float64))
    assert 1.4 < np.abs(ev).max() / _C < 1.6 and np.sum(np.abs(ev) > _C) > 40
    exact = (v * np.clip(ev, -_C, _C)) @ v.T
    assert np.abs(np.asarray(out, np.float64) - exact).max() < 2e-3


def test_clip_deflation_certificate_catches_what_the_krylov_space_missed():
    """The first Lanczos start vector is an eigenvector inside the clip (eigenvalue −0.9497):
    the first Krylov space is that vector alone, nothing is deflated, and only the second
    Lanczos run (another start vector) sees the eigenvalue −0.96 (1.05 % past the clip, wider
    than ``accept``): Newton–Schulz runs. With ``accept=0`` nothing is ever certified: the
    fallback runs, and clips as well."""
    n = 64
    start = np.asarray(linalg._start_vector(n, jnp.float32), np.float64)
    q, _ = np.linalg.qr(np.c_[start, np.random.default_rng(0).normal(size=(n, n - 1))])
    s = _spectrum_matrix_from(q, np.r_[-0.9497, -0.96, np.linspace(-0.9, 0.5, n - 2)])
    out, taken = linalg.clip_eigenvalues_matmul(s, _C, return_path=True)
    assert linalg.CLIP_PATHS[int(taken)] == "newton_schulz"
    assert np.linalg.eigvalsh(np.asarray(out, np.float64)).min() >= -_C - 1e-5

    s = _spectrum_matrix(_TRAINING)
    out, taken = linalg.clip_eigenvalues_matmul(s, _C, accept=0.0, return_path=True)
    assert linalg.CLIP_PATHS[int(taken)] == "newton_schulz"
    w, v = np.linalg.eigh(np.asarray(s, np.float64))
    assert np.abs(np.asarray(out, np.float64) - (v * np.clip(w, -_C, _C)) @ v.T).max() < 5e-5
