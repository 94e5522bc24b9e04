"""Unrolled Transformer (UT) of Yang et al. 2022, "Transformers from an optimization perspective".

Each of the ``L`` layers computes, with ``W = W̃ᵀW̃`` (one symmetric PSD matrix shared by queries,
keys and values) and ``W_f = −½·b·(W̃_f + W̃_fᵀ) + (1 − b)·I``::

    A = softmax_row(Y W Yᵀ)          # [..., T, T], normalised over the key axis
    Z = (1 − a)·Y + a·A Y            # symmetric softmax attention step
    Y ← ReLU(Z W_f + B)              # symmetric linear map + ReLU            (skip=False)
    Y ← ReLU(Z + Z W_f + B)          # the same with the residual connection (skip=True)

``skip=True`` is the gradient step of Yang et al.'s energy and the paper's eq. (48), "a linear
transformation … followed by a residual connection and a ReLU": at ``b = 1`` the layer's map is
``I − sym(W̃_f)``, so the identity is reachable whatever the eigenvalue clip; without the skip
``W_f = −sym(W̃_f)`` and the clip bounds it by ``‖W_f‖₂ ≤ 0.95``, a shrinkage at every layer.

``tying`` says which weights the layers share: ``"all"`` (one layer applied ``L`` times, the
published code; ``jax.lax.scan`` compiles one layer whatever the depth), ``"attention"`` (the
attention matrix ``W̃`` shared, one ``W̃_f, B`` per layer: the paper's Section 4, "the learnable
parameters of the attention layers are tied") or ``"none"`` (one set per layer). Per-layer
weights carry a leading ``[L]`` axis.

Every layer's state is returned, ``states[0] = x`` and ``states[L] = output``, because the
constrained training puts a loss on each of them.

Params (``model.init(key, x)``)::

    {"params": {"attn": [dim, dim] or [L, dim, dim],   # W̃
                "ffn":  [dim, dim] or [L, dim, dim],   # W̃_f
                "bias": [dim] or [L, dim]}}            # B

After every optimizer step the published code projects ``W̃_f`` (``ut_project`` /
``ut_project_tree``) to keep the map contractive and the training free of NaNs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cudt import linalg
from cudt.models.dct import dct_matrix

__all__ = [
    "ATTENTIONS",
    "TYINGS",
    "UT",
    "UT_PARAM_KEYS",
    "ut_project",
    "ut_project_tree",
    "ut_projection",
]

#: What the layers share: every weight, the attention matrix only, or nothing.
TYINGS = ("all", "attention", "none")

#: Keys that identify a UT parameter dict inside a larger pytree (see ``ut_project_tree``).
UT_PARAM_KEYS: frozenset[str] = frozenset({"attn", "ffn", "bias"})

#: The attention scores: the energy's scaled distances (the paper's UT) or the published dots.
ATTENTIONS = ("distance", "dot")

# W_f = 0.9·I at init: a contraction close to the identity, so the untrained stack is a mild
# smoother whose per-layer loss neither explodes nor collapses to zero in a few layers.
_FFN_INIT_GAIN = 0.9


def _dct_attn_init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """W̃ = dim^(−1/4)·C with C the orthonormal DCT, so W̃ᵀW̃ = I/√dim (softmax temperature)."""
    del key
    dim = shape[-1]
    return jnp.asarray(dct_matrix(dim) * dim**-0.25, dtype=dtype)


def _dct_ffn_init(b: float, skip: bool, target: float = _FFN_INIT_GAIN):
    """W̃_f = c·I with c chosen so that the layer's whole linear map is ``target·I`` (0.9·I by
    default): ``−b·c + (1 − b)`` without the skip (c = −0.9 at b = 1), ``1 − b·c + (1 − b)``
    with it (c = 0.1 at b = 1; ``target = 1``: c = 0, the layer starts as attention alone)."""
    base = (1.0 - b) + (1.0 if skip else 0.0)
    gain = (base - target) / b if b else 0.0

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        del key
        return jnp.asarray(gain * np.eye(shape[-1]), dtype=dtype)

    return init


def _stacked(init, layers: int | None):
    """``init`` for one ``[D, D]`` matrix, or for ``[L, D, D]`` with an independent draw per layer."""
    if layers is None:
        return init

    def stacked(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        keys = jax.random.split(key, shape[0])
        return jax.vmap(lambda k: init(k, shape[1:], dtype))(keys)

    return stacked


class UT(nn.Module):
    """Unrolled transformer with symmetric weights, tied across layers as ``tying`` says.

    Attributes:
        num_layers: number of unrolled layers ``L`` (>= 1).
        dim: token dimension ``D``.
        a: attention step size (``a = 0`` disables attention).
        b: residual-map weight (``b = 0`` gives ``W_f = I``).
        init_scheme: ``"dct"`` (near-identity denoiser, for video patches) or ``"xavier"``
            (text). Not called ``init``: a dataclass field of that name would shadow
            ``nn.Module.init`` and break ``model.init(key, x)``.
        dtype: compute dtype; params are stored in float32 and softmax runs in float32.
        sublayer: also return the state after each attention step ``Z``: ``states`` is then
            ``[2L+1, ...]`` (``x, Z_1, Y_1, Z_2, Y_2, ...``), so the layer outputs are
            ``states[2::2]`` (per-sub-layer descent constraints).
        attention: ``"dot"`` — ``softmax_row(Y W Yᵀ)``, the published code; or ``"distance"``
            — ``softmax_row(−½‖y_t − y_s‖²_W)``, the kernel of Yang et al.'s energy, whose
            gradient step the layer is. The two differ by the key-norm term ``−½ y_sᵀ W y_s``
            (the query-norm term cancels in the row softmax): without it, attention prefers
            keys of large W-norm (bright frames of non-negative pixels) over similar ones.
        reinject: β of a data-fidelity step after every layer, ``Y ← (1 − β)·Y + β·X`` with
            ``X`` the input (the gradient step of ``½‖Y − X‖²`` that unrolled denoisers take):
            without it nothing of the noisy input reaches the layers after the first.
        tying: ``"all"`` (default), ``"attention"`` or ``"none"``: see the module doc.
        skip: the residual connection inside the ReLU, ``ReLU(Z + Z W_f + B)`` (eq. 48).
        ffn_init: the layer's linear map at the ``"dct"`` init, ``ffn_init·I`` (0.9: a mild
            contraction; 1.0 with ``skip``: the identity, each layer then starts as the
            attention step alone).
    """

    num_layers: int
    dim: int
    a: float = 1.0
    b: float = 1.0
    init_scheme: str = "dct"
    dtype: Any = jnp.float32
    sublayer: bool = False
    attention: str = "dot"
    reinject: float = 0.0
    tying: str = "all"
    skip: bool = False
    ffn_init: float = _FFN_INIT_GAIN

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Run the ``L`` tied layers.

        Args:
            x: tokens ``[..., T, D]`` (e.g. ``[B, T, D]`` or ``[T, D]``).
            mask: optional key-padding mask ``[..., T]`` (True = real token). Padded tokens are
                never attended to; their own states are meaningless and should be masked out
                of any loss.

        Returns:
            ``(output, states)``: ``output [..., T, D] = states[-1]`` and ``states
            [L+1, ..., T, D]`` with ``states[0] = x`` (``[2L+1, ...]`` when ``sublayer``).
        """
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape [..., T, {self.dim}], got {x.shape}")
        if not 0.0 <= self.reinject < 1.0:
            raise ValueError(f"reinject must lie in [0, 1), got {self.reinject}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be 'dot' or 'distance', got {self.attention!r}")
        if self.tying not in TYINGS:
            raise ValueError(f"tying must be one of {', '.join(TYINGS)}, got {self.tying!r}")
        if self.init_scheme == "dct":
            attn_init, ffn_init = _dct_attn_init, _dct_ffn_init(self.b, self.skip, self.ffn_init)
        elif self.init_scheme == "xavier":
            attn_init = ffn_init = nn.initializers.xavier_uniform()
        else:
            raise ValueError(f"init_scheme must be 'dct' or 'xavier', got {self.init_scheme!r}")

        D, L = self.dim, self.num_layers
        attn_layers = L if self.tying == "none" else None
        ffn_layers = None if self.tying == "all" else L
        lead = lambda n: () if n is None else (n,)  # noqa: E731
        w_attn_t = self.param(
            "attn", _stacked(attn_init, attn_layers), lead(attn_layers) + (D, D), jnp.float32
        )
        w_ffn_t = self.param(
            "ffn", _stacked(ffn_init, ffn_layers), lead(ffn_layers) + (D, D), jnp.float32
        )
        bias = self.param(
            "bias", nn.initializers.zeros_init(), lead(ffn_layers) + (D,), jnp.float32
        )

        # The layer only ever sees W and W_f, so build them once, outside the scan.
        w_attn = jnp.einsum("...kd,...ke->...de", w_attn_t, w_attn_t).astype(self.dtype)
        eye = jnp.eye(D, dtype=jnp.float32)
        sym = 0.5 * (w_ffn_t + jnp.swapaxes(w_ffn_t, -1, -2))
        w_ffn = (-self.b * sym + (1.0 - self.b + float(self.skip)) * eye).astype(self.dtype)
        bias = bias.astype(self.dtype)
        a = self.a
        # per-layer weights are scanned over, shared ones closed over
        per_layer = {
            "attn": w_attn if attn_layers else None,
            "ffn": w_ffn if ffn_layers else None,
            "bias": bias if ffn_layers else None,
        }
        xs = {k: v for k, v in per_layer.items() if v is not None} or None

        y0 = x.astype(self.dtype)
        wide = jnp.promote_types(self.dtype, jnp.float32)  # the scores' and softmax's dtype
        key_mask = None if mask is None else mask.astype(bool)[..., None, :]  # [..., 1, T]

        def layer(y: jax.Array, ws: dict | None) -> tuple[jax.Array, jax.Array]:
            ws = ws or {}
            w_attn_l = ws.get("attn", w_attn)
            w_ffn_l, bias_l = ws.get("ffn", w_ffn), ws.get("bias", bias)
            # [..., T, T], accumulated in float32 (at least): bf16 scores of a few hundred
            # were off by ±2 before the float32 softmax, 16 % on the states after 4 layers
            scores = jnp.einsum(
                "...td,de,...se->...ts", y, w_attn_l, y, preferred_element_type=wide
            )
            if self.attention == "distance":  # −½‖y_t − y_s‖²_W up to the row's own term
                key_norms = jnp.diagonal(scores, axis1=-2, axis2=-1)  # y_s W y_s
                scores = scores - 0.5 * key_norms[..., None, :]
            if key_mask is not None:
                scores = jnp.where(key_mask, scores, jnp.finfo(scores.dtype).min)
            attn = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
            z = (1.0 - a) * y + a * jnp.einsum("...ts,...sd->...td", attn, y)
            y = jax.nn.relu(jnp.einsum("...td,de->...te", z, w_ffn_l) + bias_l)
            if self.reinject:
                y = (1.0 - self.reinject) * y + self.reinject * y0
            return y, ((z, y) if self.sublayer else y)

        _, ys = jax.lax.scan(layer, y0, xs, length=L)  # [L, ..., T, D]
        if self.sublayer:
            zs, ys = ys  # each [L, ..., T, D]
            # Interleave to [2L, ..., T, D]: Z_1, Y_1, Z_2, Y_2, ...
            ys = jnp.stack([zs, ys], axis=1).reshape((-1,) + y0.shape)
        states = jnp.concatenate([y0[None], ys], axis=0)  # [L+1 or 2L+1, ..., T, D]
        return states[-1], states


# ut_project's matrix-product methods -> cudt.linalg.clip_eigenvalues_matmul's
_MATMUL_METHODS = {"matmul": "auto", "lanczos": "lanczos", "newton_schulz": "newton_schulz"}


def _project_symmetric(w: jax.Array, clip: float, method: str = "matmul") -> jax.Array:
    """Symmetrise ``w [..., D, D]`` and clip its eigenvalues to ``[−clip, clip]``."""
    dtype = w.dtype
    w32 = w.astype(jnp.float32)  # eigh has no bf16/f16 kernel
    sym = 0.5 * (w32 + jnp.swapaxes(w32, -1, -2))
    if method in _MATMUL_METHODS:  # runs stacked on leading axes are handled by the function
        return linalg.clip_eigenvalues_matmul(sym, clip, method=_MATMUL_METHODS[method]).astype(
            dtype
        )
    if method != "eigh":
        raise ValueError(
            f"method must be 'matmul', 'lanczos', 'newton_schulz' or 'eigh', got {method!r}"
        )
    evals, evecs = linalg.eigh(sym)  # vmap-safe on CPU, see cudt.linalg
    proj = jnp.einsum("...ik,...k,...jk->...ij", evecs, jnp.clip(evals, -clip, clip), evecs)
    # A feasible matrix is returned bit-exact (not via the eigh round trip), so repeated
    # projections after every step do not accumulate floating-point drift.
    feasible = jnp.all(jnp.abs(evals) <= clip, axis=-1)[..., None, None]
    return jnp.where(feasible, sym, proj).astype(dtype)


def _is_ut_params(node: Any) -> bool:
    return isinstance(node, Mapping) and UT_PARAM_KEYS <= set(node.keys())


def _project_ut_dict(
    params: Mapping[str, Any], clip: float, method: str, lower: float | None = None
) -> dict[str, Any]:
    out = dict(params)
    w = params["ffn"]
    if lower is None:
        out["ffn"] = _project_symmetric(w, clip, method)
        return out
    # eigenvalues in [lower, clip] <=> those of (w - centre I) in [-half, half]
    centre, half = 0.5 * (clip + lower), 0.5 * (clip - lower)
    eye = jnp.eye(w.shape[-1], dtype=w.dtype)
    shifted = w - centre * eye
    projected = _project_symmetric(shifted, half, method)
    # an entry the projection left alone is w's own: (w − c) + c is not w to the last bit, so a
    # feasible W̃_f came back 1 ulp off on its diagonal
    out["ffn"] = jnp.where(projected == shifted, w, projected + centre * eye)
    return out


def ut_project_tree(
    tree: Any, clip: float = 0.95, method: str = "matmul", lower: float | None = None
) -> Any:
    """Project every UT param dict found anywhere in a nested-dict pytree (see ``ut_project``).

    A UT param dict is any ``Mapping`` whose keys include ``{"attn", "ffn", "bias"}`` (the names
    ``UT`` uses). Other Mappings are rebuilt as plain ``dict`` with their children walked;
    non-mapping leaves are returned as is. Trees without a UT dict come back unchanged.
    """
    if _is_ut_params(tree):
        return _project_ut_dict(tree, clip, method, lower)
    if isinstance(tree, Mapping):
        return {k: ut_project_tree(v, clip, method, lower) for k, v in tree.items()}
    return tree


def ut_project(
    params: Any, clip: float = 0.95, method: str = "matmul", *, lower: float | None = None
) -> Any:
    """Projection applied after every optimizer step (the published UT code's stabiliser).

    ``W̃_f`` is replaced by its symmetric part with eigenvalues clipped to ``[−clip, clip]``;
    the model only depends on that symmetric part, so this projects ``W_f`` onto
    ``‖W_f − (1 − b)I‖₂ ≤ b·clip``. An already-feasible symmetric ``W̃_f`` is returned bit-exact
    (by the default method: when ``‖W̃_f‖₂ ≤ (1 − 1e-3)·clip``). Pure and jittable.

    ``method="matmul"`` (default): :func:`cudt.linalg.clip_eigenvalues_matmul` (its
    ``method="auto"``: Lanczos deflation on CPU as described here, Newton–Schulz on GPU/TPU,
    where a chain of matrix-vector steps is latency-bound), no LAPACK, so it runs the same whatever the process's OpenBLAS
    setting. A 64-step Lanczos run on the symmetric ``W̃_f`` skips the clipping (``lax.cond``,
    one branch per run under ``vmap`` on CPU) when its estimate of ``‖W̃_f‖₂`` (a lower bound)
    is at most ``(1 − 1e-3)·clip``; otherwise it deflates the Ritz pairs past the clip onto it,
    ``W̃_f − Σ (θ_i − clip·sign θ_i) u_i u_iᵀ``, and keeps the result when certified: the Ritz
    residuals bound its Frobenius distance to the exact clipping by ``3.5e-3·clip`` (plus any
    eigenvalue past the clip that Lanczos missed; Newton–Schulz's own resolution there), and
    a second Lanczos run from another start vector finds the result's
    ``‖·‖₂ ≤ (1 + 3.5e-3)·clip``. Otherwise (more than 16 eigenvalues past the clip, a spread
    spectrum or a missed eigenvalue past that band, a random init) it falls back to
    ``method="newton_schulz"``. Bounds and costs in that function's docstring. The case the
    deflation is built for: a clip active at every step with a few eigenvalues past it, as in
    the published UT's video training (``tests/test_linalg.py`` checks a spectrum of that shape).
    ``method="lanczos"`` or ``"newton_schulz"`` pins one of the two whatever the device.
    ``method="newton_schulz"`` (the default before): a skip test of the same kind (Lanczos on
    ``W̃_f²``), then Newton–Schulz sign and inverse square root, 34 matmuls (error below the
    distance ``δ`` of an eigenvalue to the clip, zero to float32 for ``δ ≥ 0.0033``).
    ``method="eigh"``: LAPACK's symmetric eigensolver (``cudt.linalg.eigh``), exact; on a CPU it
    wants one OpenBLAS thread (``cudt.runner.cli.configure_process``): with OpenBLAS's default
    threads next to XLA's it is slow and erratic on a shared machine.
    Use another method as ``functools.partial(ut_project, method="eigh")``.

    Contract: ``params`` is either one UT's own dict ``{"attn", "ffn", "bias"}`` or any nested
    dict holding such dicts, e.g. the full ``model.init`` output ``{"params": {...}}`` or a
    bigger model with a UT submodule; every dict whose keys include ``{"attn", "ffn", "bias"}``
    is projected (its ``"ffn"`` leaf only), everything else is returned untouched. Extra
    leading axes on ``ffn`` (runs stacked by ``vmap``) are projected independently.

    ``lower``: clip the eigenvalues to ``[lower, clip]`` instead of ``[−clip, clip]``. With the
    skip at ``b = 1`` (``W_f = I − sym(W̃_f)``), ``lower = 0`` keeps ``sym(W̃_f)`` positive
    semi-definite: the layer is then the gradient step of Yang et al.'s convex energy
    ``½‖W̃ y‖²``, whose map ``I − W`` is non-expansive (eigenvalues in ``[1 − clip, 1]``) with the
    identity reachable. (Projecting ``W̃_f − c·I`` onto ``[−h, h]``, ``c`` the interval's centre,
    ``h`` its half-width: every method above serves.)

    Raises:
        KeyError: if ``params`` contains no UT param dict (almost surely a wiring mistake).
    """
    found = _is_ut_params(params) or any(
        _is_ut_params(node) for node in jax.tree_util.tree_leaves(params, is_leaf=_is_ut_params)
    )
    if not found:
        raise KeyError(f"no UT param dict (keys {sorted(UT_PARAM_KEYS)}) found in params")
    if lower is not None and not lower < clip:
        raise ValueError(f"lower must be below clip, got lower={lower}, clip={clip}")
    return ut_project_tree(params, clip, method, lower)


def ut_projection(model: UT, clip: float = 0.95):
    """The projection to apply after every optimizer step of ``model``: ``ut_project`` with
    ``clip`` (0: None, no projection), and ``lower=0`` when the model has the skip at ``b = 1``,
    so its ``W_f = I − sym(W̃_f)`` stays the non-expansive energy step (eigenvalues in
    ``[1 − clip, 1]``); otherwise the published ``[−clip, clip]``. A ``functools.partial``, so
    its ``clip`` and ``lower`` can be read back (the PyTorch mirror of the benchmarks does)."""
    if not clip:
        return None
    lower = 0.0 if model.skip and model.b == 1.0 else None
    return functools.partial(ut_project, clip=clip, lower=lower)
