"""What a task's model must give the runner, checked before anything is written.

A task's :class:`~cudt.runner.task.GroupModel` is pure functions; the runner learns their
shapes only when it trains and evaluates them. A model whose per-sample losses are ``[B, L]``
or ``[L+1, B]``, an ``eval_outputs`` without ``"losses"``, or an empty split failed deep in
training or after it (a traceback, the training lost, ``--out`` written). :func:`check_model`
traces the model abstractly (``jax.eval_shape``: no computation) on a batch of the training
and validation examples and refuses such a model in one line, before ``--out`` is opened.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import UsageError
from cudt.runner.task import GroupModel, RunBatch, Task

__all__ = ["check_model"]

SPLITS = ("train", "val", "test")


def check_model(task: Task, cfg, data, model: GroupModel) -> None:
    """Refuses, with a :class:`UsageError`, a model of ``task`` the runner cannot train or
    evaluate: a split without examples, per-sample ``layer_losses`` that are not floating
    ``[B, L+1]`` (``L``: ``model.num_layers``), or ``eval_outputs`` without ``"losses"`` of
    ``[B, L+1]`` or with an output that is not ``[B, S]``."""
    who = f"{task.name} model {model.name!r}"
    for split in SPLITS:
        if _hook(task.split_size, data, split, model) == 0:
            raise UsageError(
                f"{who}: the {split} split has no examples (the runner trains on train, "
                "judges and chooses on val, reports on test): give every split at least one "
                "example"
            )
    params = jax.eval_shape(model.init, jax.random.key(0))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    gamma = jax.ShapeDtypeStruct((), jnp.float32)
    rows = cfg.batch_size
    examples = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct((rows, *np.shape(a)[1:]), a.dtype),
        _hook(task.train_examples, data, model),
    )
    index = jax.ShapeDtypeStruct((rows,), jnp.int32)
    batch = RunBatch(examples, gamma, model.frozen, index)
    losses = jax.eval_shape(model.layer_losses, params, batch, key)
    _check_losses(f"{who}: layer_losses", losses, rows, model.num_layers)
    first = next(iter(_hook(task.eval_batches, data, "val", model, cfg.eval_batch_size)))
    rows = len(first.index)
    outputs = jax.eval_shape(
        model.eval_outputs,
        params,
        model.frozen,
        first.examples,
        jnp.asarray(first.index),
        gamma,
        key,
    )
    if not isinstance(outputs, dict) or "losses" not in outputs:
        got = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
        raise UsageError(
            f"{who}: eval_outputs returns {got}, without 'losses': return a dict with "
            f"'losses', the per-sample losses of every state [B, {model.num_layers + 1}]"
        )
    _check_losses(f"{who}: eval_outputs' 'losses'", outputs["losses"], rows, model.num_layers)
    for name, value in outputs.items():
        shape = getattr(value, "shape", None)  # None, a dict: not an array
        if shape is None or len(shape) != 2 or shape[0] != rows:
            got = f"has shape {tuple(shape)}" if shape is not None else f"is {type(value).__name__}"
            raise UsageError(
                f"{who}: eval_outputs' {name!r} {got}, not an array [B, S] "
                f"(B = {rows}, the batch's examples): return one row per example"
            )


def _hook(hook, *args) -> Any:
    """A data hook of the task, whose missing implementation is named in one line."""
    try:
        return hook(*args)
    except NotImplementedError as e:
        raise UsageError(
            f"{e}: define split_examples(data, split, model), or train_examples, eval_batches "
            "and split_size (docs/design.md, 'A task, from scratch')"
        ) from None


def _check_losses(what: str, losses, rows: int, num_layers: int) -> None:
    """``losses`` (a shape) is floating ``[rows, num_layers + 1]``, or one line says why not."""
    states = num_layers + 1
    shape = tuple(getattr(losses, "shape", ()))
    if shape != (rows, states):
        fix = (
            "return losses.T (these look like [L+1, B], a state's losses a row)"
            if shape == (states, rows)
            else f"return one per-sample loss per state 0..{num_layers} (the input state "
            f"first), or give GroupModel the model's number of layers (it says {num_layers})"
        )
        raise UsageError(
            f"{what} has shape {shape}, not [B, L+1] = [{rows}, {states}] (B = {rows} "
            f"examples, L = {num_layers} layers): {fix}"
        )
    if not jnp.issubdtype(losses.dtype, jnp.floating):
        raise UsageError(f"{what} are {losses.dtype}: return floating-point per-sample losses")
