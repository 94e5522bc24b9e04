"""The paper's step by name: the layerwise-descent problem through the one constrained step.

    import cudt, optax
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    init, step = cudt.make_train_step(layer_losses, optax.adam(1e-3), cudt.dual_ascent(1e-2), cfg)
    state = init(params)                      # multipliers start at 0
    state, metrics = step(state, batch, key)  # one jitted, compiled program

``layer_losses(params, batch, key) -> [B, L+1]`` is the user's function: per-sample losses of every
layer's state (column 0 the input state, column L the output). :func:`make_train_step` is
:func:`cudt.descent.problem` handed to :func:`cudt.make_constrained_step`, so every option of that
step applies: ``update`` (simultaneous, alternating, extragradient, optimistic), ``formulation``,
any dual optimiser, ``constraint`` (mean, indexed, tail) and resilience (``DescentConfig``'s
``resilience`` and ``resilience_mode``: the dual decay or explicit slacks) in any combination.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

from cudt.constrained import ConstrainedState, Implicit, implicit_mlp, make_constrained_step
from cudt.descent import _problem as descent
from cudt.descent._config import DescentConfig
from cudt.knobs import KNOBS, knobs

__all__ = ["make_train_step"]

LayerLosses = Callable[[Any, Any, jax.Array], jax.Array]
# init's keywords: every knob that goes into the state (gamma_train goes to the batch)
INIT_KNOBS = tuple(k.name for k in KNOBS if k.goes != "data")


def make_train_step(
    layer_losses: LayerLosses,
    optimizer: optax.GradientTransformation,
    dual_optimizer: optax.GradientTransformation,
    config: DescentConfig,
    *,
    constraint: str = "mean",
    formulation=None,
    update: str = "simultaneous",
    num_examples: int | None = None,
    example_ids: Callable[[Any], jax.Array] | None = None,
    multipliers: str | Implicit = "table",
    example_features: Callable[[Any, jax.Array], Any] | None = None,
    project_params: Callable[[Any], Any] | None = None,
    objective: str = "loss",
    jit: bool = True,
    donate: bool = True,
):
    """``(init, step)`` of the descent problem (:mod:`cudt.descent`) through
    :func:`cudt.make_constrained_step`.

    Args:
      layer_losses: ``(params, batch, key) -> [B, L+1]`` per-sample losses of layers 0..L.
      optimizer: the primal optax optimiser (minimises the Lagrangian in the parameters).
      dual_optimizer: a dual transformation of :mod:`cudt.constrained` (``cudt.dual_ascent(lr)``,
        ``cudt.dual_adam(lr)``, ``cudt.nupi(lr, kp=...)`` or ``cudt.as_dual(any_optax)``).
      config: the constraints; its ε, reference, resilience, β and constrained are the
        *defaults* of the per-run values that ``init`` puts in the state; the rest (layers,
        warm-up, resilience mode, slack rate and restarts) is static.
      constraint: ``"mean"`` (the paper's), ``"indexed"`` (per example: a table needs
        ``num_examples`` and ``example_ids``) or ``"tail"`` (CVaR of the per-sample ratios).
      formulation, update: as :func:`cudt.make_constrained_step`'s.
      multipliers: ``"indexed"``'s multipliers: ``"table"`` (one per example and layer, the
        table of ``num_examples`` rows), ``"implicit"`` (a model of the examples' features,
        :func:`cudt.implicit_mlp` from ``example_features`` to the ``L`` layers' λ, the same
        size whatever the data set, no ``example_ids``) or a :func:`cudt.implicit` model.
      example_features: ``(batch, losses [B, L+1]) -> [B, F]``, the features of implicit
        multipliers; default :func:`cudt.descent.loss_features` (``F = L``).
      project_params: applied to the parameters ``init`` is given and after every primal
        update (e.g. the UT's eigenvalue clipping, :func:`cudt.models.ut_project`).
      objective: ``"loss"`` (mean ℓ_L, the paper's), ``"violation"`` (phase I, trained as ERM:
        :func:`cudt.descent.violation`, the constraints' total normalised violation) or
        ``"judged_violation"`` (over the steps the verdicts judge, :func:`~.judged_steps`).
      jit, donate: as :func:`cudt.make_constrained_step`'s (``jit=False``: the pure step, to
        ``vmap`` over runs and ``scan`` over steps).

    ``init(params, *, constrained=None, dual_hparams=None, **values)`` overrides the config's
    values for one run (arrays under ``vmap``: a sweep); ``values`` are the knobs of
    :mod:`cudt.knobs` by name (``INIT_KNOBS``: ``epsilon``, ``epsilon_schedule``,
    ``reference``, ``lr``, ``dual_lr``, ``resilience``, ``penalty``, ``tail_beta``, ``nupi_kp``,
    ``nupi_ema``), each put where its row says (``tail_beta`` with ``constraint="tail"`` only).
    ``reference`` NaN means no reference constraint; ``resilience`` inf means hard constraints.
    ``lr`` / ``dual_lr`` / ``nupi_*`` / ``dual_hparams`` (any other injected name: ``{name:
    value}``) need optimisers built with ``optax.inject_hyperparams``
    (:func:`cudt.optim.dual_optimizer` injects ``nupi_kp`` and ``nupi_ema``). It returns a :class:`cudt.ConstrainedState`; its
    multipliers are ``{"reference": [], "descent": [L]}`` (``cudt.descent.multipliers(state)``:
    the ``[L+1]`` vector, index 0 the reference).

    ``metrics`` (:func:`cudt.descent.metrics`): ``objective`` (mean ℓ_L), ``lagrangian``,
    ``layer_loss [L+1]``, ``constraint [L+1]`` (g), ``grad_norm``, measured where the step took
    its gradient (before the step; ``"optimistic"``: its extrapolated point), and after the step
    ``multipliers [L+1]``, ``slacks [L+1]`` (explicit slacks), ``multipliers_max`` (indexed).
    """
    cfg = _checked(config)
    model, features = _implicit_model(multipliers, constraint, cfg.num_layers, example_features)
    table = constraint == "indexed" and model is None
    if table and num_examples is None:
        raise ValueError("constraint='indexed' needs num_examples=N (the multiplier table's rows)")
    problem = descent.problem(
        layer_losses,
        cfg,
        constraint,
        example_ids=example_ids or (None if model is None else _no_rows),
        example_features=features,
        objective=objective,
    )
    shapes = descent.constraints(cfg, constraint)
    c_init, c_step = make_constrained_step(
        problem,
        optimizer,
        dual_optimizer,
        formulation,
        update,
        has_aux=True,
        project_params=project_params,
        warmup_steps=cfg.warmup_steps,
        slack_optimizer=optax.sgd(cfg.slack_lr),
        slack_restart_steps=cfg.slack_restart_steps if cfg.uses_slacks else None,
        jit=False,
        implicit=None if model is None else {"descent": model},
    )
    init = _descent_init(c_init, cfg, shapes, constraint, num_examples if table else None)

    def step(state: ConstrainedState, batch, key: jax.Array):
        state, m = c_step(state, batch, key)
        return state, descent.metrics(state, m, constraint)

    if jit:
        step = jax.jit(step, donate_argnums=(0,) if donate else ())
    return init, step


def _no_rows(batch) -> None:
    """The ids of implicit multipliers' examples where none were given: none (the constraint is
    not indexed; the model reads the examples' features)."""
    return None


def _checked(config) -> DescentConfig:
    """``config``, refused in one line where it is not a :class:`DescentConfig` (the arguments
    given in another order, say)."""
    if not isinstance(config, DescentConfig):
        raise TypeError(
            f"make_train_step's config must be a cudt.DescentConfig, got "
            f"{type(config).__name__}: call make_train_step(layer_losses, optimizer, "
            "dual_optimizer, cudt.DescentConfig(num_layers=L, ...))"
        )
    return config


def _implicit_model(multipliers, constraint: str, num_layers: int, example_features):
    """``(model, features)`` of the descent constraint's implicit multipliers: ``(None, None)``
    for a table or no per-example constraint; the features default to
    :func:`cudt.descent.loss_features`."""
    if isinstance(multipliers, Implicit):
        model = multipliers
    elif multipliers == "implicit":
        if example_features is not None:
            raise ValueError(
                "multipliers='implicit' builds its model for loss_features (L features): with "
                "example_features of your own, pass multipliers=cudt.implicit(apply, params)"
            )
        model = implicit_mlp(num_layers, (num_layers,))
    elif multipliers == "table":
        return None, None
    else:
        raise ValueError(
            f"multipliers must be 'table', 'implicit' or a cudt.implicit model, got {multipliers!r}"
        )
    if constraint != "indexed":
        raise ValueError(
            f"implicit multipliers are per example: constraint {constraint!r} has one multiplier "
            "per layer; use constraint='indexed'"
        )
    return model, descent.loss_features if example_features is None else example_features


def _descent_init(
    c_init: Callable, cfg: DescentConfig, shapes, constraint: str, table_rows: int | None
) -> Callable:
    """:func:`make_train_step`'s ``init``: the config's per-run values, overridden by its
    arguments, handed to the constrained step's ``c_init`` with the constraints' ``shapes``
    (``table_rows``: the rows of ``"indexed"``'s multiplier table, None without one)."""
    num_indexed = None if table_rows is None else {"descent": table_rows}

    def init(params, *extra, constrained=None, dual_hparams=None, **values) -> ConstrainedState:
        if extra:
            raise TypeError(
                "make_train_step's init takes the params alone (the constraints' shapes come "
                "from its config), then per-run values by name: init(params, epsilon=...); "
                "make_constrained_step's init is the one that takes a batch"
            )
        unknown = [n for n in values if n not in INIT_KNOBS]
        if unknown:
            raise TypeError(
                f"init() got an unexpected keyword argument {unknown[0]!r}: the per-run values "
                f"are {', '.join(INIT_KNOBS)} (cudt.knobs)"
            )
        hparams = descent.hparams(cfg, **{k.name: values.get(k.name) for k in knobs("problem")})
        if values.get("tail_beta") is not None and constraint != "tail":
            raise ValueError(
                f"init's tail_beta is beta of constraint='tail' (the CVaR of the per-sample "
                f"ratios), and this step's constraint is {constraint!r} (it would sit in the "
                "state unread): drop tail_beta= or build the step with constraint='tail'"
            )
        named = {k.state_key or k.name: values.get(k.name) for k in knobs("dual")}
        twice = sorted(n for n in dict(dual_hparams or {}) if named.get(n) is not None)
        if twice:  # the dict's value silently won over the keyword's
            knob = next(k.name for k in knobs("dual") if (k.state_key or k.name) == twice[0])
            raise ValueError(
                f"init got the dual optimiser's {twice[0]!r} twice, as {knob}= and in "
                "dual_hparams: pass it once"
            )
        return c_init(
            params,
            constraints=shapes,
            num_indexed=num_indexed,
            hparams=hparams,
            constrained=cfg.constrained if constrained is None else constrained,
            lr=values.get("lr"),
            dual_hparams=named | dict(dual_hparams or {}),
            penalty=values.get("penalty"),
        )

    return init
