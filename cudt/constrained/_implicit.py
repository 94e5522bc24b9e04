"""Implicit multipliers: a small model maps an example's features to its multipliers.

    model = cudt.implicit(apply, params)          # λ_i = positive(apply(φ, features_i))
    init, step = cudt.make_constrained_step(problem, primal, dual, implicit={"per_sample": model})
    # the problem returns cudt.Constraint(g_i, features=f_i) (and may keep index=ids)

An indexed constraint's table holds ``N × ...`` multipliers: it grows with the data set and says
nothing about an example it has not seen. An implicit constraint keeps instead the parameters φ
of a model ``λ(φ, x) = positive(apply(φ, x))`` in ``state.multipliers[name]`` (any pytree, the
same size whatever N: it vmaps over runs, shards replicated and checkpoints like the table), and
the step evaluates it at the batch's features (``Constraint(..., features=f)``, stop-gradient).

φ is trained by ascent on the Lagrangian with the step's dual optimiser (any of
:func:`cudt.dual_ascent`, :func:`cudt.dual_adam`, :func:`cudt.nupi`, :func:`cudt.as_dual`): the
dual gradient of every row ``d_i`` is the table's (``g/s``, with resilience ``g/s − λ/α``), and
φ's is its pull-back through the model, ``(1/B) Σ_i ∂λ_i/∂φ · d_i``, the gradient of the batch
*mean* of the rows' terms: with a bias in the model, a dual learning rate moves λ about as far
as it moves a table's row (the sum would move it B times as far). φ is handed to the optimiser
as a :class:`cudt.FreeSign`, so its projection leaves the parameters alone; λ is non-negative
by the map ``positive``:

- ``"relu"`` (default): ``λ = max(a, 0)`` of the model's output ``a``, with projected ascent's
  rule for the rows at 0: a row at ``a ≤ 0`` pulls φ up when its constraint is violated
  (``d_i > 0``) and not at all otherwise, as a table's row at 0 moves up or stays. A model whose
  output starts at 0 (:func:`implicit_mlp`) starts where the table starts, at λ = 0;
- ``"softplus"``: ``λ = log(1 + e^a)``, smooth, positive everywhere (never exactly 0), with
  slope ``1 − e^{−λ}``: small multipliers move slowly under SGD-like dual optimisers.

Equality constraints use ``a`` itself (free sign). ``dual_radius`` R caps the map,
``min(λ, R)`` (``|λ| ≤ R`` for equalities), and a capped row pulls φ only back inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["POSITIVES", "Implicit", "implicit", "implicit_mlp"]

POSITIVES = ("relu", "softplus")


@dataclasses.dataclass(frozen=True)
class Implicit:
    """The static part of implicit multipliers: ``apply(φ, features [B, ...]) -> [B, ...]`` (the
    constraint's value shape), ``positive`` and, optionally, a starting φ (``params``)."""

    apply: Callable[[Any, Any], Any]
    params: Any = None
    positive: str = "relu"

    def __post_init__(self):
        if not callable(self.apply):
            raise TypeError("cudt.implicit needs apply(params, features) -> raw multipliers")
        if self.positive not in POSITIVES:
            raise ValueError(
                f"positive must be one of {', '.join(POSITIVES)}, got {self.positive!r}"
            )


def implicit(apply: Callable[[Any, Any], Any], params=None, positive: str = "relu") -> Implicit:
    """Implicit multipliers ``λ_i = positive(apply(params, features_i))`` (module docstring);
    ``params`` is φ of a new state unless ``init(..., multipliers={name: φ})`` gives one."""
    return Implicit(apply, params, positive)


def implicit_mlp(
    num_features: int,
    out_shape: tuple[int, ...] = (),
    *,
    hidden: int = 16,
    positive: str = "relu",
    key: jax.Array | None = None,
) -> Implicit:
    """A one-hidden-layer model ``a = W₂ tanh(W₁ f + b₁) + b₂`` from ``[B, num_features]``
    features to ``[B, *out_shape]`` multipliers, with ``W₂ = 0``: every example starts at the
    same multiplier, ``positive(b₂)`` = 0 for ``"relu"`` (the table's start), ``log 2`` for
    ``"softplus"``. ``W₁`` is drawn from ``key`` (default ``key(0)``), scaled by
    ``1/√num_features``."""
    if num_features < 1 or hidden < 1:
        raise ValueError(
            f"implicit_mlp needs num_features and hidden >= 1, got {num_features}, {hidden}"
        )
    if any(int(d) < 1 for d in out_shape):
        raise ValueError(
            f"implicit_mlp's out_shape must have dimensions >= 1, got {tuple(out_shape)}: pass "
            "the shape of one example's constraint values (() for one value)"
        )
    key = jax.random.key(0) if key is None else key
    out = int(jnp.prod(jnp.asarray(out_shape, jnp.int32))) if out_shape else 1
    params = {
        "w1": jax.random.normal(key, (num_features, hidden), jnp.float32) / num_features**0.5,
        "b1": jnp.zeros((hidden,), jnp.float32),
        "w2": jnp.zeros((hidden, out), jnp.float32),
        "b2": jnp.zeros((out,), jnp.float32),
    }
    shape = tuple(out_shape)

    def apply(p, features):
        f = jnp.asarray(features, jnp.float32).reshape(features.shape[0], -1)
        a = jnp.tanh(f @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return a.reshape((features.shape[0],) + shape)

    return Implicit(apply, params, positive)


def _map(model: Implicit, a, kind: str, radius):
    """λ from the model's output ``a``."""
    if kind == "eq":
        return a if radius is None else jnp.clip(a, -radius, radius)
    lam = jax.nn.relu(a) if model.positive == "relu" else jax.nn.softplus(a)
    return lam if radius is None else jnp.minimum(lam, radius)


def rows(model: Implicit, phi, features, kind: str, radius=None):
    """The multipliers of the batch's rows: the model at ``features`` (stop-gradient)."""
    a = model.apply(phi, jax.lax.stop_gradient(features))
    return _map(model, a, kind, radius)


def ascent_gradient(model: Implicit, phi, features, d, kind: str, radius=None):
    """φ's dual gradient from the rows' ``d`` (module docstring): ``(1/B) Σ_i ∂λ_i/∂φ · d_i``,
    with projected ascent's rule at λ = 0 (``"relu"``) and at the cap ``radius``."""
    a, vjp_fn = jax.vjp(lambda p: model.apply(p, jax.lax.stop_gradient(features)), phi)
    d = d.astype(a.dtype)
    if kind == "eq":
        slope = jnp.ones_like(a)
    elif model.positive == "relu":
        slope = ((a > 0) | (d > 0)).astype(a.dtype)
    else:
        slope = jax.nn.sigmoid(a)
    if radius is not None:
        lam = _map(model, a, kind, None)
        inside = (lam < radius) | (d < 0)
        if kind == "eq":
            inside = inside & ((lam > -radius) | (d > 0))
        slope = slope * inside.astype(a.dtype)
    (grad,) = vjp_fn(d * slope / a.shape[0])
    return grad
