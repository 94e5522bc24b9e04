"""The video setting every video subcommand times, built by the runner's own wiring.

Nothing here restates a constant of the main job: the setting is a
:class:`cudt.tasks.video.VideoConfig` (its defaults ARE ``python -m experiments.video_denoise``'s:
γ, ε, the learning rates, nuPI duals with alternating updates, the models' sizes), and the step
is the one the runner trains, built by the same calls :func:`cudt.runner.run` makes:
``VideoTask.load`` / ``build`` and :class:`cudt.runner.groups.GroupProgram` (which wires
:func:`cudt.runner.groups.make_group_step`: the model's layer losses and projection,
:func:`cudt.optim.primal_optimizer`, :func:`cudt.optim.dual_optimizer`, the run's
hyperparameters in its state). The benchmarks change three fields only: ``warmup_steps=0``
(the duals move from the first step, so the equal-work checks exercise them; the warm-up is a
per-step flag of the same program), ``kinds="constrained"`` and ``seeds`` (how many runs).

Two primal-dual dynamics are compared against PyTorch + Cooper (:data:`DYNAMICS`):

* ``video default``: the config as it is (nuPI duals, K_P = 5, dual lr 1000, alternating:
  dual first, then primal with the new multipliers, from one forward);
* ``paper``: the shared :class:`cudt.runner.config.RunConfig` defaults of the dual fields
  (Adam duals, lr 5e-2, simultaneous updates): the paper's Algorithm 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.common import choice_list, positive_int, subcommand_parser
from cudt.knobs import knob_names
from cudt.runner.config import RunConfig, field_defaults
from cudt.runner.groups import Group, GroupProgram, name_group
from cudt.runner.sweep import model_defaults
from cudt.runner.task import GroupModel, RunBatch
from cudt.tasks.video import VideoConfig, VideoTask, build_model, dust_per_layer

__all__ = [
    "DYNAMICS",
    "VIDEO_MODELS",
    "VideoSetup",
    "dynamics_config",
    "video_config",
    "video_parser",
    "video_setup",
]

# The dual fields a dynamics sets; "paper" takes RunConfig's own defaults of them.
_DUAL_FIELDS = ("dual_optimizer", "update", *knob_names("dual"))
_SHARED = field_defaults(RunConfig)
DYNAMICS = {
    "video default": {},
    "paper": {name: _SHARED[name] for name in _DUAL_FIELDS},
}

# --quick: the smallest video setting that still has every part (2 layers, 3 short videos).
QUICK_VIDEO = dict(layers=2, num_videos=3, num_frames=8, seq_len=4)


def video_config(quick: bool = False, **overrides: Any) -> VideoConfig:
    """The main job's config (``VideoConfig()``), one constrained run (ε and the dual rate not
    tuned: the step's cost does not depend on them), the duals on from step 1;
    ``quick``: :data:`QUICK_VIDEO` sizes; ``overrides`` replace fields (``layers=3``)."""
    fields = dict(
        kinds="constrained", seeds=1, warmup_steps=0, tune_epsilon=(), tune_dual_lr=(), tune_lr=()
    )
    if quick:
        fields |= QUICK_VIDEO
    return VideoConfig(**(fields | overrides))


VIDEO_MODELS = ("ut", "dust")


def video_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The parser every video subcommand starts from: ``--models``, ``--layers`` and
    ``--batch-size``, each defaulting to :class:`VideoConfig`'s."""
    defaults = video_config()
    p = subcommand_parser(prog, doc)
    models = [m for m in defaults.models if m in VIDEO_MODELS]
    p.add_argument(
        "--models",
        type=choice_list(VIDEO_MODELS, "model"),
        default=models,
        help=f"comma-separated models (default: VideoConfig's, {','.join(models)})",
    )
    p.add_argument("--layers", type=positive_int, default=None, help="L (default: VideoConfig's)")
    p.add_argument(
        "--batch-size", type=positive_int, default=None, help="B (default: VideoConfig's)"
    )
    return p


def dynamics_config(cfg: VideoConfig, dynamics: str) -> VideoConfig:
    """``cfg`` with the dual fields of ``dynamics`` (:data:`DYNAMICS`)."""
    return dataclasses.replace(cfg, **DYNAMICS[dynamics])


@dataclasses.dataclass
class VideoSetup:
    """One model of the video task as the runner trains it (a group of ``cfg.seeds`` runs)."""

    name: str  # "UT-5", "DUST-5"
    model_name: str  # "ut", "dust"
    cfg: VideoConfig
    data: Any  # cudt.data.video.VideoSplits
    model: GroupModel  # the runner's: layer_losses(params, RunBatch, key), project, init
    module: Any  # the flax module behind it (its hyperparameters, for the PyTorch mirror)
    program: GroupProgram  # the group's step (pure), initial states, per-run arrays

    @property
    def step(self):
        """The runner's step, pure: ``step(state, RunBatch, key) -> (state, metrics)``."""
        return self.program.step

    @functools.cached_property
    def jitted(self):
        """The step jitted with the state donated (what one compiled step costs)."""
        return jax.jit(self.program.step, donate_argnums=0)

    def states(self):
        """The group's initial states, ``[R, ...]`` (the runner's ``initial_states``)."""
        return self.program.initial_states()

    def state(self, run: int = 0):
        """Run ``run``'s initial state alone (no leading run axis)."""
        return jax.tree.map(lambda a: a[run], self.states())

    def params(self, run: int = 0):
        """Run ``run``'s initial parameters (``model.init`` of its init key)."""
        return self.model.init(self.program.init_keys[run])

    def batch(self, batch_size: int | None = None) -> RunBatch:
        """The first ``batch_size`` (default ``cfg.batch_size``) training sequences as the
        runner hands them to the step (the run's γ, its examples' rows)."""
        b = batch_size or self.cfg.batch_size
        examples = jnp.asarray(self.data.train[:b])
        return RunBatch(
            examples, jnp.float32(self.cfg.gamma_train), self.model.frozen, jnp.arange(b)
        )

    @property
    def noise_scale(self) -> float:
        """γ·σ_x in float32, the scale of the noise the layer losses draw."""
        return float(jnp.float32(self.cfg.gamma_train) * jnp.float32(self.data.sigma))

    def describe(self) -> str:
        c = self.cfg
        dual = f"{c.dual_optimizer} duals (lr {c.dual_lr:g}"
        if c.dual_optimizer == "nupi":
            dual += f", K_P {c.nupi_kp:g}, K_I 1, EMA {c.nupi_ema:g}"
        return (
            f"{self.name}: batch {c.batch_size}x{c.seq_len}x{self.data.train.shape[-1]}, "
            f"γ {c.gamma_train:g}, ε {c.epsilon:g}, Adam lr {self.program.per_run['lr'][0]:g}, "
            f"{dual}), {c.update} updates"
        )


_DATA: dict[tuple, Any] = {}


def load_video(cfg: VideoConfig):
    """``VideoTask().load(cfg)``, read once per data setting in this process."""
    key = (
        cfg.dataset,
        cfg.data_dir,
        cfg.seq_len,
        cfg.num_videos,
        cfg.num_frames,
        cfg.data_rng_seed,
    )
    if key not in _DATA:
        _DATA[key] = VideoTask().load(cfg)
    return _DATA[key]


_SETUPS: dict[tuple, VideoSetup] = {}


def video_setup(cfg: VideoConfig, model_name: str) -> VideoSetup:
    """The constrained group of ``model_name`` (``ut`` or ``dust``) under ``cfg``, built as
    :func:`cudt.runner.run` builds it; built once per config in this process (a setup holds
    no run's state, and its jitted step is compiled once)."""
    if (cfg, model_name) not in _SETUPS:
        _SETUPS[cfg, model_name] = _build(cfg, model_name)
    return _SETUPS[cfg, model_name]


def _build(cfg: VideoConfig, model_name: str) -> VideoSetup:
    # the model's own values (--model-hparams) written into the config the peer reads too
    cfg = dataclasses.replace(cfg, **model_defaults(cfg, model_name), model_hparams=())
    task = VideoTask()
    data = load_video(cfg)
    structure = task.structure(cfg, model_name, True)
    specs = [s for s in task.run_specs(cfg) if s.model == model_name and s.constrained]
    if not specs:
        raise ValueError(f"no constrained {model_name} run in this config")
    group = Group(model_name, structure, specs)
    group.model = task.build(cfg, data, model_name, structure)
    name_group(group, [])
    program = GroupProgram(task, cfg, data, group)
    module, _ = build_model(
        model_name,
        cfg,
        per_layer_dictionary=dust_per_layer(cfg, structure),
        patch_dim=data.train.shape[-1],
    )
    name = f"{model_name.upper()}-{cfg.layers}"
    return VideoSetup(name, model_name, cfg, data, group.model, module, program)
