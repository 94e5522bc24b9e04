"""The task protocol: what a task says, and nothing else.

A task (video denoising, text classification, ...) is a subclass of :class:`Task` in
``cudt/tasks/``. It loads its data, builds the model of each group of runs with its per-sample
layer losses and evaluation outputs, and turns evaluation outputs into its metrics, columns and
figures. Validation, output folders, resume, fault injection, divergence, sweeps, devices,
training, evaluation, best-run selection, results, tables, plots and TensorBoard logs live in
:func:`cudt.runner.run` once.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from cudt.runner.hparams import resolve_reference
from cudt.runner.report import Column
from cudt.runner.sweep import RunSpec, expand_runs, selected_kinds

__all__ = ["EvalBatch", "GroupModel", "RunBatch", "Task"]


class RunBatch(NamedTuple):
    """What a group's ``layer_losses(params, batch, key)`` receives at every training step."""

    examples: Any  # the task's examples, [B, ...] leaves (split over the mesh's data axis)
    gamma: jax.Array  # [] this run's training perturbation level
    frozen: Any  # frozen tables shared by every run: jit arguments, not baked-in constants
    index: Any = None  # [B] int: each example's row in the training set (--constraint indexed)


class EvalBatch(NamedTuple):
    examples: Any  # [B, ...] leaves (every batch of a split has the same B)
    index: np.ndarray  # [B] example indices (noise is a function of the index, not the batch)
    count: int  # the first ``count`` rows are real, the rest pad the batch to its size


@dataclasses.dataclass(frozen=True, eq=False)
class GroupModel:
    """One model structure, as the runner sees it: pure functions and their frozen inputs.

    Attributes:
      name: the model's name (``dust``, ``minilm``, ...).
      num_layers: L, so per-sample losses are ``[B, L+1]``.
      init: ``key -> params`` of one run.
      layer_losses: ``(params, RunBatch, key) -> [B, L+1]``.
      eval_outputs: ``(params, frozen, examples, index [B], gamma, key) -> {name: [B, S]}``
        for one run; ``"losses"`` (per-sample layer losses) is required, anything else
        (``"correct"``) is handed to :meth:`Task.run_metrics`.
      eval_last: ``eval_outputs`` of the last state only (``{name: [B, 1]}``), or None. The
        runner calls it at every γ that is no run's γ_train (where only the last state's
        metrics are reported); the per-state values there are then NaN but the last. For a
        model whose per-state outputs dominate the evaluation (the LLM's vocabulary readouts).
      frozen: arrays every run reads and none trains (a word-embedding table).
      project: applied to the params at init and after every optimizer step (or None).
      record: extra fields of every run record of this group (``blocks``, ``granularity``).
    """

    name: str
    num_layers: int
    init: Callable[[jax.Array], Any]
    layer_losses: Callable[[Any, RunBatch, jax.Array], jax.Array]
    eval_outputs: Callable[..., dict[str, jax.Array]]
    eval_last: Callable[..., dict[str, jax.Array]] | None = None
    frozen: Any = None
    project: Callable[[Any], Any] | None = None
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


class Task(abc.ABC):
    """Base class of the tasks (``cudt/tasks/video.py``; the smallest: docs/design.md).

    A task is stateless: every hook takes the run's config ``cfg`` first (where it reads it)
    and whatever :meth:`load` returned as ``data``; a hook that needs something read earlier
    (a pretrained model) finds it in ``data``, never on ``self``. The hooks come in three
    groups; the five abstract ones are required, the rest have a default that is right for
    most tasks:

    * data: :meth:`load`, :meth:`fingerprint` (required: what checkpoints depend on beyond
      the config), :meth:`describe`, :meth:`split_examples`, and for a task whose examples are
      not one array per split :meth:`split_size`, :meth:`train_examples`,
      :meth:`eval_batches`; :meth:`chance_level`.
    * model: :meth:`model_names`, :meth:`build` (required), :meth:`kinds`, :meth:`default_lr`,
      :meth:`structure`, :meth:`warmup_steps`, :meth:`inert_states`.
    * report: :meth:`test_gamma_grid` (required), :meth:`val_gammas`, :meth:`selection_for`,
      :meth:`val_metrics`, :meth:`run_metrics`, :meth:`trained_outputs`,
      :meth:`config_extras`, :meth:`results_extras`, :meth:`metric_columns`,
      :meth:`after_columns`, :meth:`table_footer`, :meth:`figures`, :meth:`outputs`,
      :meth:`finish`.

    Flags and their checks live in ``config_cls`` (choice checks in ``flag(check=one_of(…))``);
    the runner checks what every task shares (``--inject-nan``'s model among
    :meth:`model_names`).
    """

    name: str = "task"  # runs/<name>-<time>, results.json "experiment"
    config_cls: type = None  # the task's RunConfig subclass
    # The default primal warm-up is one epoch, capped at this fraction of --steps (None: no cap).
    warmup_cap: float | None = None

    # -- data ------------------------------------------------------------------------------
    @abc.abstractmethod
    def load(self, cfg) -> Any:
        """Reads the data, and anything the models are built from (pretrained weights), into
        one object every later hook receives as ``data``. Every data error is raised here,
        before anything is written."""

    @abc.abstractmethod
    def fingerprint(self, cfg, data) -> dict[str, Any]:
        """What checkpoints depend on besides the config (the data's source and shape,
        pretrained folders; data read from files by a digest of what they hold,
        ``train_digest``: :func:`cudt.io.digest`): a resumed run whose fingerprint differs is
        refused. ``{}`` only when the config alone determines the data. Where it gives no
        ``train_digest`` the runner adds its own digest of the training examples
        (``examples_digest``: :func:`cudt.runner.run.examples_digests`)."""

    def describe(self, cfg, data) -> list[str]:
        """Lines printed once the data (and models) are read."""
        return []

    def split_examples(self, data, split: str, model: GroupModel) -> Any:
        """The examples of ``split`` (``"train"``, ``"val"``, ``"test"``) as ``model`` reads
        them (patch sequences, whole frames, token ids, ...). Required unless the task
        overrides :meth:`train_examples`, :meth:`eval_batches` and :meth:`split_size`."""
        raise NotImplementedError(f"{type(self).__name__} defines no split_examples")

    def split_size(self, data, split: str, model: GroupModel) -> int:
        return jax.tree.leaves(self.split_examples(data, split, model))[0].shape[0]

    def train_examples(self, data, model: GroupModel) -> Any:
        """The training examples of ``model``'s group, a pytree of ``[N, ...]`` arrays (moved
        to the devices once). Default: :meth:`split_examples` of ``"train"``."""
        return self.split_examples(data, "train", model)

    def eval_batches(self, data, split: str, model: GroupModel, batch_size: int):
        """``Iterator[EvalBatch]`` over ``split`` (``"val"`` or ``"test"``), every batch of one
        size. Default: :meth:`split_examples` cut in order, the last batch padded."""
        examples = self.split_examples(data, split, model)
        n = self.split_size(data, split, model)
        return cut_in_batches(examples, n, min(batch_size, n))

    def chance_level(self, data) -> float | None:
        """The loss of a uniform guess (ln K for K classes), which ``--reference chance+X``
        adds X to; None (the default) for a task without one (regression)."""
        return None

    def resolve_reference(self, value: str | None, data) -> float | None:
        """The bound C of ``E ℓ_0 <= C`` named by ``--reference`` (see
        :func:`cudt.runner.hparams.resolve_reference`); not a hook: override
        :meth:`chance_level`."""
        return resolve_reference(value, self.chance_level(data), self.name)

    # -- model -----------------------------------------------------------------------------
    @abc.abstractmethod
    def model_names(self, cfg) -> list[str]:
        """The models ``cfg`` asks for (``--models``), one group of runs (or two) each."""

    @abc.abstractmethod
    def build(self, cfg, data, name: str, structure: Hashable) -> GroupModel:
        """Model ``name`` of :meth:`structure` ``structure``: its init, per-sample layer
        losses and evaluation outputs as pure functions (:class:`GroupModel`)."""

    def kinds(self, cfg, name: str) -> tuple[bool, ...]:
        """Which of ERM (False) and constrained (True) runs model ``name`` trains (a control
        model may be ERM only)."""
        return (False, True)

    def default_lr(self, cfg, name: str) -> float:
        return 1e-3

    def structure(self, cfg, name: str, constrained: bool) -> Hashable:
        """What makes ERM and constrained models of ``name`` different programs (None: they
        share one, ERM being a per-run flag)."""
        return None

    def run_specs(self, cfg) -> list[RunSpec]:
        """Every run ``cfg`` asks of this task: each model's kinds (``--kinds``), sweep points
        and seeds (:func:`cudt.runner.sweep.expand_runs`); the runner groups these. Not a
        hook: it reads :meth:`model_names`, :meth:`default_lr` and :meth:`kinds`."""
        return expand_runs(
            cfg,
            self.model_names(cfg),
            lambda m: self.default_lr(cfg, m),
            lambda m: selected_kinds(cfg, self.kinds(cfg, m)),
        )

    def warmup_steps(self, cfg, steps_per_epoch: int) -> int:
        """Primal warm-up: ``cfg.warmup_steps``, else one epoch (at most ``warmup_cap`` of the
        steps)."""
        if cfg.warmup_steps is not None:
            return cfg.warmup_steps
        if self.warmup_cap is None:
            return steps_per_epoch
        return min(steps_per_epoch, int(cfg.steps * self.warmup_cap))

    def inert_states(self, cfg, model: GroupModel, gamma_train: float) -> dict[int, str]:
        """States of ``model`` whose loss is ~0 by construction at ``gamma_train`` (e.g. the
        clean input itself at γ = 0), each with why: the descent constraint after such a state
        asks ℓ_l ≤ (1 − ε)·0 and is infeasible by construction. The runner says so in one line
        before training a constrained run there. Default: none."""
        return {}

    # -- report ----------------------------------------------------------------------------
    @abc.abstractmethod
    def test_gamma_grid(self, cfg, gamma_train: float) -> list[float]:
        """The test γ grid of a run trained at ``gamma_train`` (it must contain it); the runner
        evaluates every run on the union of the grids."""

    def val_gammas(self, cfg, gamma_trains: list[float], test_gammas: list[float]) -> list[float]:
        """The γ at which validation data is scored. Every run's γ_train is always among them
        (feasibility is judged there); a task whose best-run score needs more (a validation
        AUC) adds them. Default: the γ_train values only."""
        return list(gamma_trains)

    def selection_for(self, cfg) -> tuple[str, bool]:
        """The best-run score of this configuration: (run key, higher is better). Default:
        the validation objective, lower is better."""
        return ("val_objective", False)

    def val_metrics(
        self, cfg, val: dict[str, np.ndarray], val_gammas: list[float], gamma_train: float
    ) -> dict[str, Any]:
        """Metrics of one run from its validation outputs at every γ of :meth:`val_gammas`
        (``val[name]`` is ``[Gv, N, S]``), e.g. the score :meth:`selection_for` names."""
        return {}

    def run_metrics(
        self, cfg, test: dict[str, np.ndarray], val: dict[str, np.ndarray], gammas, gamma_train
    ) -> dict[str, Any]:
        """The task's metrics of one run from its evaluation outputs: ``test[name]`` is
        ``[G, N, S]`` over the test γ grid, ``val[name]`` ``[N, S]`` at its γ_train."""
        return {}

    def trained_outputs(self, cfg, data, model: GroupModel, params, labels) -> list[dict]:
        """Extra fields of each run's record computed from its trained parameters (e.g.
        generated text); ``params`` are the group's stacked ``[R, ...]`` parameters, in the
        order of ``labels``. Called once per group after evaluation."""
        return [{} for _ in labels]

    def config_extras(self, cfg, data) -> dict[str, Any]:
        """Derived values written into results.json's config."""
        return {}

    def results_extras(self, cfg, data) -> dict[str, Any]:
        """Top-level entries of results.json besides the runner's (reference figures)."""
        return {}

    def metric_columns(self) -> list[Column]:
        """Table columns after the run's identity (model, L, kind, seed, swept values)."""
        return []

    def after_columns(self) -> list[Column]:
        """Table columns after the descent statistics, before feasibility."""
        return []

    def table_footer(self, runs: list[dict]) -> str:
        """Lines printed under the summary table (the figures behind the plots)."""
        return ""

    def figures(self, cfg, runs, ratios, out: Path, gammas) -> list[Path]:
        """Writes the task's figures into ``out``; returns their paths. ``ratios``: per run (in
        ``runs``' order), its test ratios ``ℓ_l / ℓ_(l−1)`` ``[N, L]``, NaN where a ratio is
        excluded (its ``ℓ_(l−1)`` below the floor: :func:`cudt.metrics.descent_stats`), or None
        for a diverged run. Not called under ``--no-figures``: a file that is no figure goes in
        :meth:`outputs`."""
        return []

    def outputs(self, cfg, runs, ratios, out: Path, gammas) -> list[Path]:
        """Writes into ``out`` the task's files from the evaluation that are no figure (the LLM
        task's ``completions.md``), with or without ``--no-figures``; returns the paths to list
        in results.json's ``files`` (what ``--overwrite`` removes). Arguments as
        :meth:`figures`'."""
        return []

    def finish(self, cfg, data, results: dict, out: Path) -> None:
        """What the task writes from the finished run, after ``results.json`` (e.g. the LLM
        task's ``--export``: the chosen runs' models, read back from their checkpoints)."""
        return None


def cut_in_batches(examples: Any, n: int, batch_size: int) -> Iterator[EvalBatch]:
    """Consecutive batches of ``batch_size`` rows; the last one padded with its first row, so
    every batch has one shape (one compiled evaluation program)."""
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        count = index.size
        rows = (
            np.concatenate([index, np.full(batch_size - count, index[0])])
            if count < batch_size
            else index
        )
        batch = jax.tree.map(lambda a, rows=rows: np.asarray(a)[rows], examples)
        # padded rows keep distinct indices, so their noise never aliases a real row's
        full = np.arange(start, start + batch_size)
        yield EvalBatch(batch, full, count)
