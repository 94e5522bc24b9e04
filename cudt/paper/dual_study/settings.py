"""The dual study's settings (the defaults it covers, their base rates) and its combinations
(formulation × dual optimiser × update)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["DUAL_OPTIMIZERS", "SETTINGS", "Combo", "Setting"]

DUAL_OPTIMIZERS = ("sgd", "adam", "nupi")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One default the study covers: its task, the fields that make it, and its scales."""

    name: str
    title: str
    make_task: Callable[[], Any]
    config_cls: Callable[[], type]
    fields: dict[str, Any]
    tiny: dict[str, Any]  # fields added at --scale tiny
    dual_lr: dict[str, float]  # base dual rate per dual optimiser
    plain: str  # the dual optimiser of plain projected ascent, recorded by the ERM runs
    augmented_penalty: float  # ρ of the augmented Lagrangian
    penalty: float  # base ρ of the quadratic penalty (× the factors)
    id_metric: str  # "rmse" (lower is better) or "accuracy" (higher)
    # config fields whose default the task resolves into results.json, as resolved for ``cfg``
    # (what a finished call's saved config is compared with; see cudt.paper.job.SubRun)
    resolved: Callable[[Any], dict[str, Any]] = lambda cfg: {}

    def base_rate(self, combo: Combo) -> float:
        """What ×1 means for ``combo``: the base dual rate of its optimiser, or the penalty's ρ."""
        return self.penalty if combo.swept == "penalty" else self.dual_lr[combo.dual_optimizer]


def _video_task():
    from cudt.tasks.video import VideoTask

    return VideoTask()


def _video_config():
    from cudt.tasks.video import VideoConfig

    return VideoConfig


def _text_task():
    from cudt.tasks.text import TextTask

    return TextTask()


def _text_resolved(cfg) -> dict[str, Any]:
    from cudt.tasks.text import TextTask, max_length_of

    lr = cfg.lr if cfg.lr is not None else TextTask().default_lr(cfg, cfg.model)
    return {"lr": lr, "max_length": max_length_of(cfg)}


def _text_config():
    from cudt.tasks.text import TextConfig

    return TextConfig


_VIDEO_TINY = dict(
    layers=3,
    num_videos=3,
    num_frames=8,
    seq_len=4,
    batch_size=16,
    dust_atoms=16,
    eval_batch_size=128,
    steps=30,
    chunk_steps=30,
    warmup_steps=5,
)

SETTINGS: dict[str, Setting] = {
    **{
        name: Setting(
            name=name,
            title=title,
            make_task=_video_task,
            config_cls=_video_config,
            fields=fields,
            tiny=_VIDEO_TINY,
            dual_lr={"sgd": 1000.0, "nupi": 1000.0, "adam": 1.0},
            plain="sgd",
            augmented_penalty=1000.0,
            penalty=1e6,
            id_metric="rmse",
        )
        for name, title, fields in (
            (
                "video",
                "video default (constrained DUST, one dictionary per layer)",
                dict(models=("dust",), dust_control=False),
            ),
            ("ut", "constrained UT (video default data)", dict(models=("ut",))),
        )
    },
    "text": Setting(
        name="text",
        title="text default (MiniLM)",
        make_task=_text_task,
        config_cls=_text_config,
        fields={},
        tiny=dict(
            num_train=40,
            num_test=20,
            max_length=16,
            batch_size=8,
            test_gammas=(0.0, 2.0),
            gamma_train=1.0,
            eval_batch_size=32,
            steps=30,
            chunk_steps=30,
            warmup_steps=5,
        ),
        dual_lr={"sgd": 10.0, "nupi": 10.0, "adam": 0.1},
        plain="adam",
        augmented_penalty=10.0,
        penalty=1e3,
        id_metric="accuracy",
        resolved=_text_resolved,
    ),
}


@dataclasses.dataclass(frozen=True)
class Combo:
    """A formulation × dual optimiser × update. The quadratic penalty has no multipliers: its
    dual optimiser is ``-``, and what is swept is its ρ."""

    formulation: str
    dual_optimizer: str
    update: str

    @property
    def slug(self) -> str:
        return f"{self.formulation}-{self.dual_optimizer.replace('-', 'none')}-{self.update}"

    @property
    def label(self) -> str:
        return f"{self.formulation} · {self.dual_optimizer} · {self.update}"

    @property
    def swept(self) -> str:
        return "penalty" if self.formulation == "penalty" else "dual_lr"
