"""Deep Unfolded Sequential Transformer (DUST, De Weerdt et al. 2023) as adapted in the paper.

Denoising only (no measurement matrix), LISTA matrices coupled to the dictionary, fixed
regularisation weights; the ONLY trainable parameter is the dictionary (Appendix C.4). Tokens
are flattened patches ``x [P]``; a sequence is one patch location over ``T`` frames. Codes are
rows ``z [K]`` (``K > P``, overcomplete) with reconstruction ``x̂ = z Dᵀ``. Layer ``l`` (with
``D_l [P, K]`` and ``μ_l = ‖D_l‖₂²``)::

    R = Z D_lᵀ                                           # [..., T, P] current reconstructions
    A = softmax_row(temperature · R Rᵀ)                  # [..., T, T] frame similarity
    Z ← (1 − a)·Z + a·A Z                                # symmetric softmax attention
    Z ← soft(Z + (1/μ_l)(X − Z D_lᵀ) D_l, τ/μ_l)         # coupled LISTA step on the noisy X

The attended code's reconstruction ``Z D_lᵀ`` in the LISTA step is computed by linearity as
``(1 − a)·R + a·A R`` (a ``T x T`` product instead of a ``K -> P`` one per token), and with a
tied dictionary ``R`` is the previous layer's output state: three of the four ``[..., K] x
[K, P]``-sized products per layer remain (two when tied), the same function up to rounding.

States are the RECONSTRUCTIONS ``X̂_l = Z_l D_lᵀ`` (the loss is computed on them), ``states[0]``
uses the first layer's dictionary.

Initial code (a choice the paper leaves open): ``initial_code="dual"`` (default) uses the
canonical dual frame, ``Z_0 = X (D_0 D_0ᵀ)⁻¹ D_0``, which reconstructs ``X`` exactly for any
full-row-rank ``D_0``: the overcomplete DCT is not a tight frame (eigenvalues of ``D Dᵀ`` in
about ``[1, 2.58]`` for 16x16 patches, 20 atoms per axis), so the scaled adjoint
``Z_0 = X D_0/μ_0`` (``initial_code="adjoint"``) would shrink the patch mean by ~0.45 and make
``states[0]`` a poor copy of the input. Both coincide for a tight frame. ``initial_code="zero"`` is the paper's (Appendix C.3): ``Z_0 =
0``, so ``states[0]`` is the zero image and ℓ_0 the signal's energy, whatever the noise.

Which state 0 to use at γ_train = 0: with ``"dual"`` (or a UT, whose state 0 is its input) the
clean input is reconstructed exactly, ℓ_0 ≈ 0, and the first descent constraint
``ℓ_1 ≤ (1 − ε)·ℓ_0`` is infeasible by construction; the runner reports it as not applicable.
With ``"zero"`` it is an ordinary constraint (layer 1 must recover 1 − ε of the signal). The
default stays ``"dual"``: every recorded result used it, and at γ_train > 0 it is the better
start (state 0 is the noisy input, not a blank); ``--dust-initial-code zero`` in the video task
runs the paper's (docs/results/video.md has what it changes on a tiny run).

Params (``model.init(key, x)``)::

    {"params": {"dictionary": [P, K]}}        # per_layer_dictionary=False (tied)
    {"params": {"dictionary": [L, P, K]}}     # per_layer_dictionary=True
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cudt import linalg
from cudt.models.dct import dct2_dictionary

__all__ = ["DUST", "INITIAL_CODES", "hold_dictionaries_near", "soft_threshold", "spectral_norm_sq"]

INITIAL_CODES = ("dual", "adjoint", "zero")


def soft_threshold(z: jax.Array, theta: jax.Array | float) -> jax.Array:
    """Proximal operator of ``theta·‖·‖₁``: ``sign(z)·max(|z| − theta, 0)``."""
    return jnp.sign(z) * jnp.maximum(jnp.abs(z) - theta, 0.0)


def spectral_norm_sq(d: jax.Array, method: str = "power") -> jax.Array:
    """``‖D‖₂²`` = largest eigenvalue of ``D Dᵀ`` for ``d [..., P, K]``; returns ``[...]``.

    Behind a ``stop_gradient``: the LISTA step size is treated as a constant (differentiating
    an eigenvalue at a repeated top eigenvalue, a tight frame, would give NaN gradients).
    ``method="power"`` (default): matrix-vector products only
    (Lanczos, :func:`cudt.linalg.gram_top_eigenvalue`: a lower bound; its accuracy is there);
    ``"eigh"``: LAPACK's ``eigvalsh`` of the ``P x P`` Gram matrix (``cudt.linalg.eigvalsh``).
    """
    if method == "power":
        return linalg.gram_top_eigenvalue(d)
    if method != "eigh":
        raise ValueError(f"method must be 'power' or 'eigh', got {method!r}")
    d = jax.lax.stop_gradient(d).astype(jnp.float32)
    gram = jnp.einsum("...pk,...qk->...pq", d, d)
    return linalg.eigvalsh(gram)[..., -1]


def hold_dictionaries_near(params: Any, spread: float) -> Any:
    """Hold one-per-layer dictionaries near their mean: the projection applied after every
    optimizer step of a per-layer DUST under ``--dust-spread``.

    With ``D̄`` the layers' mean and ``Δ_l = D_l − D̄``, every ``Δ_l`` is shrunk by one common
    factor ``s = min(1, spread·‖D̄‖_F / max_l ‖Δ_l‖_F)``, so afterwards ``‖D_l − D̄‖_F ≤
    spread·‖D̄‖_F`` at every layer and the mean is unchanged (``Σ_l Δ_l = 0``). ``spread = 0``
    ties the layers (every ``D_l = D̄``); a large one leaves them free. Dictionaries already
    inside come back bit-exact. Pure and jittable; other leaves (a tied ``[P, K]``
    dictionary) pass through.

    Why (docs/results/video.md, "Dictionaries held near their mean"): a tied
    dictionary descends on every set of videos but its constraints do nothing; free per-layer
    ones meet the constraints on training batches only at the edge, where a layer's ratio
    ``ℓ_l / ℓ_{l−1}`` moves 2.5-4x more between data sets than a tied one's.
    """
    if spread < 0:
        raise ValueError(f"spread must be >= 0, got {spread}")

    def hold(path: tuple, d: Any) -> Any:
        if getattr(path[-1], "key", None) != "dictionary" or getattr(d, "ndim", 0) != 3:
            return d  # a tied [P, K] dictionary, or another leaf
        mean = jnp.mean(d, axis=0)
        delta = d - mean
        far = jnp.sqrt(jnp.max(jnp.sum(delta**2, axis=(1, 2))))
        limit = spread * jnp.sqrt(jnp.sum(mean**2))
        shrink = limit / jnp.maximum(far, jnp.finfo(d.dtype).tiny)
        return jnp.where(far > limit, mean + shrink * delta, d)

    return jax.tree_util.tree_map_with_path(hold, params)


class DUST(nn.Module):
    """Unrolled sparse coding with symmetric attention across frames.

    Attributes:
        num_layers: number of unrolled layers ``L`` (>= 1).
        patch_dim: token size ``P`` (a square, ``P = patch**2``).
        atoms_per_dim: 1-D DCT atoms per axis; ``K = atoms_per_dim**2`` (``>= P``).
        per_layer_dictionary: one dictionary per layer (``[L, P, K]``, each initialised to the
            same DCT) instead of one shared ``[P, K]``.
        threshold: sparsity weight ``τ`` (soft threshold ``τ/μ_l``), fixed.
        attention_weight: attention step ``a``, fixed.
        temperature: attention score scale; ``None`` means ``1/sqrt(P)``.
        initial_code: ``"dual"`` (exact reconstruction of X at state 0), ``"adjoint"``
            (``Z_0 = X D_0/μ_0``) or ``"zero"`` (``Z_0 = 0``, the paper's); see the module
            docstring.
        dtype: compute dtype; the dictionary is stored in float32 and the Gram solve, ``μ``
            and the softmax run in float32.
        linalg: ``"matmul"`` (default): ``μ_l`` by Lanczos iteration and the dual frame's
            ``(D_0 D_0ᵀ)⁻¹`` by Newton–Schulz iteration, matrix products only (no LAPACK in
            the step; error bounds in :mod:`cudt.linalg`); ``"lapack"``: the exact
            ``eigvalsh`` and ``solve``.
    """

    num_layers: int
    patch_dim: int = 256
    atoms_per_dim: int = 20
    per_layer_dictionary: bool = False
    threshold: float = 0.01
    attention_weight: float = 0.5
    temperature: float | None = None
    initial_code: str = "dual"
    dtype: Any = jnp.float32
    linalg: str = "matmul"

    @property
    def num_atoms(self) -> int:
        """``K``, the number of dictionary atoms."""
        return self.atoms_per_dim**2

    @nn.compact
    def __call__(
        self, x: jax.Array, return_codes: bool = False
    ) -> tuple[jax.Array, jax.Array] | tuple[jax.Array, jax.Array, jax.Array]:
        """Denoise ``x``.

        Args:
            x: noisy patches ``[..., T, P]`` (e.g. ``[B, T, P]`` or ``[T, P]``).
            return_codes: also return the sparse codes.

        Returns:
            ``(output, states)`` or ``(output, states, codes)``: ``output [..., T, P] =
            states[-1]``, reconstructions ``states [L+1, ..., T, P]``, codes ``[L+1, ..., T, K]``.
        """
        patch = math.isqrt(self.patch_dim)
        if patch * patch != self.patch_dim:
            raise ValueError(f"patch_dim must be a perfect square, got {self.patch_dim}")
        if self.atoms_per_dim < patch:
            raise ValueError(f"atoms_per_dim must be >= {patch}, got {self.atoms_per_dim}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if x.ndim < 2 or x.shape[-1] != self.patch_dim:
            raise ValueError(f"expected x of shape [..., T, {self.patch_dim}], got {x.shape}")
        if self.initial_code not in INITIAL_CODES:
            raise ValueError(
                f"initial_code must be one of {', '.join(INITIAL_CODES)}, got {self.initial_code!r}"
            )
        if self.linalg not in ("matmul", "lapack"):
            raise ValueError(f"linalg must be 'matmul' or 'lapack', got {self.linalg!r}")
        exact = self.linalg == "lapack"

        atoms_per_dim = self.atoms_per_dim

        def dct_init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
            del key
            d = jnp.asarray(dct2_dictionary(patch, atoms_per_dim), dtype=dtype)  # [P, K]
            return jnp.broadcast_to(d, shape)

        shape: tuple[int, ...] = (self.patch_dim, self.num_atoms)
        if self.per_layer_dictionary:
            shape = (self.num_layers, *shape)
        dictionary = self.param("dictionary", dct_init, shape, jnp.float32)

        temperature = (
            1.0 / math.sqrt(self.patch_dim) if self.temperature is None else self.temperature
        )
        a, tau, dt = self.attention_weight, self.threshold, self.dtype
        xc = x.astype(dt)

        mu = spectral_norm_sq(dictionary, "eigh" if exact else "power")  # [] or [L]
        d0 = dictionary[0] if self.per_layer_dictionary else dictionary  # [P, K]
        mu0 = mu[0] if self.per_layer_dictionary else mu

        if self.initial_code == "zero":  # the paper's: no code, a blank state 0
            z0 = jnp.zeros((*xc.shape[:-1], self.num_atoms), dt)
            recon0 = jnp.zeros_like(xc)
        elif self.initial_code == "dual":
            # Z_0 = X (D Dᵀ)⁻¹ D: the minimum-norm code with Z_0 D_0ᵀ = X. D Dᵀ ⪰ I at init.
            gram = jnp.einsum("pk,qk->pq", d0, d0)
            if exact:
                enc = linalg.solve(gram, d0)  # [P, K]
            else:  # μ_0 = λ_max(gram) starts Newton–Schulz
                enc = linalg.spd_solve(gram, d0, jax.lax.stop_gradient(mu0))
        else:
            enc = d0 / mu0
        if self.initial_code != "zero":
            z0 = jnp.einsum("...tp,pk->...tk", xc, enc.astype(dt))  # [..., T, K]
            recon0 = jnp.einsum("...tk,pk->...tp", z0, d0.astype(dt))

        def layer(
            z: jax.Array, recon: jax.Array, d: jax.Array, mu_l: jax.Array
        ) -> tuple[jax.Array, jax.Array]:
            """One layer from ``z`` and ``recon = z dᵀ``; returns the new ``(z, z dᵀ)``."""
            wide = jnp.promote_types(dt, jnp.float32)  # scores and softmax: float32 at least
            scores = jnp.einsum("...tp,...sp->...ts", recon, recon, preferred_element_type=wide)
            attn = jax.nn.softmax(temperature * scores, axis=-1).astype(dt)
            z = (1.0 - a) * z + a * jnp.einsum("...ts,...sk->...tk", attn, z)
            # ((1 − a)·Z + a·A Z) Dᵀ = (1 − a)·R + a·A R: a [T, T] x [T, P] product per
            # sequence instead of a [K] -> [P] product per token (and two fewer in the backward).
            recon = (1.0 - a) * recon + a * jnp.einsum("...ts,...sp->...tp", attn, recon)
            step = (1.0 / mu_l).astype(dt)
            resid = xc - recon  # [..., T, P]
            z = soft_threshold(z + step * jnp.einsum("...tp,pk->...tk", resid, d), tau * step)
            return z, jnp.einsum("...tk,pk->...tp", z, d)

        if self.per_layer_dictionary:

            def per_layer(z, layer_params):
                d, mu_l = layer_params
                d = d.astype(dt)
                z, recon = layer(z, jnp.einsum("...tk,pk->...tp", z, d), d, mu_l)
                return z, (z, recon)

            _, (zs, recons) = jax.lax.scan(per_layer, z0, (dictionary, mu))
        else:
            # Tied: the body closes over the one dictionary, so a layer's input reconstruction
            # is the previous layer's output state, carried instead of recomputed.
            d = dictionary.astype(dt)

            def tied(carry, _):
                z, recon = layer(*carry, d, mu)
                return (z, recon), (z, recon)

            _, (zs, recons) = jax.lax.scan(tied, (z0, recon0), None, length=self.num_layers)
        states = jnp.concatenate([recon0[None], recons], axis=0)  # [L+1, ..., T, P]
        if return_codes:
            codes = jnp.concatenate([z0[None], zs], axis=0)  # [L+1, ..., T, K]
            return states[-1], states, codes
        return states[-1], states
