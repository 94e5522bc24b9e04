"""The dual study's settings (the defaults it covers, their base rates) and its combinations
(formulation × dual optimiser × update)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from experiments.paper.job import TINY_VIDEO

__all__ = ["DUAL_OPTIMIZERS", "SETTINGS", "Call", "Combo", "Setting"]

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
    # (what a finished call's saved config is compared with; see experiments.paper.job.SubRun)
    resolved: Callable[[Any], dict[str, Any]] = lambda cfg: {}
    # merge the combinations that share a program into one call (more lanes held at once): off
    # where a lane is large (text: a pretrained MiniLM with its Adam state, ~0.2 GB; the merged
    # 60-lane call reached 12.3 GB resident and was killed for memory on a 23 GB machine)
    merge_calls: bool = True

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


_VIDEO_TINY = TINY_VIDEO | dict(
    dust_atoms=16,
    # one evaluation batch (200 sequences per split) at three test levels (ID 0.5, OOD 1): the
    # evaluation was half of a tiny call's time (eight passes of two padded batches)
    eval_batch_size=200,
    test_gammas=(0.0, 0.5, 1.0),
)


def _video_tiny(models: tuple[str, ...]) -> dict[str, Any]:
    """:data:`_VIDEO_TINY` for a setting training ``models``: the DUST dictionary's size where
    it trains DUST (a UT-only config refuses a DUST flag that would act on nothing)."""
    return {k: v for k, v in _VIDEO_TINY.items() if k != "dust_atoms" or "dust" in models}


SETTINGS: dict[str, Setting] = {
    **{
        name: Setting(
            name=name,
            title=title,
            make_task=_video_task,
            config_cls=_video_config,
            fields=fields,
            tiny=_video_tiny(fields["models"]),
            dual_lr={"sgd": 1000.0, "nupi": 1000.0, "adam": 1.0},
            plain="sgd",
            augmented_penalty=1000.0,
            penalty=1e6,
            id_metric="rmse",
        )
        for name, title, fields in (
            # Both at the video default of the study's run: γ_train = 0.5, the shared ε = 0.1
            # (the models' own --model-hparams and the paper's noise came after it), the
            # published dot attention for the UT, the shared feasibility tolerance 0.05 (the
            # video task's is 2.5 % since) (docs/results/dual_study.md).
            (
                "video",
                "video default (constrained DUST, one dictionary per layer)",
                dict(
                    models=("dust",),
                    dust_control=False,
                    gamma_train=0.5,
                    model_hparams=(),
                    tolerance=0.05,
                ),
            ),
            (  # the published UT, which the study found no dynamics for (docs/results/dual_study.md)
                "ut",
                "constrained published UT (shared weights, no skip; video default data)",
                dict(
                    models=("ut",),
                    ut_tying="all",
                    ut_skip=False,
                    ut_attention="dot",
                    gamma_train=0.5,
                    model_hparams=(),
                    tolerance=0.05,
                ),
            ),
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
        merge_calls=False,
    ),
}


@dataclasses.dataclass(frozen=True)
class Combo:
    """A formulation × dual optimiser × update. The quadratic penalty has no multipliers: its
    dual optimiser is ``-``, and what is swept is its ρ."""

    formulation: str
    dual_optimizer: str
    update: str
    schedule: str = "constant"  # ε's path to its value (--epsilon-schedule)

    @property
    def slug(self) -> str:
        return f"{self.formulation}-{self.dual_optimizer.replace('-', 'none')}-{self.update}"

    @property
    def label(self) -> str:
        label = f"{self.formulation} · {self.dual_optimizer} · {self.update}"
        return label if self.schedule == "constant" else f"{label} · ε {self.schedule}"

    @property
    def swept(self) -> str:
        return "penalty" if self.formulation == "penalty" else "dual_lr"


@dataclasses.dataclass(frozen=True)
class Call:
    """One runner call: the combinations that share a compiled program, as sweep points of it.

    The augmented Lagrangian at ρ = 0 is the Lagrangian (the same step, bit for bit: its
    quadratic term and that term's gradient are exact zeros), and nuPI at K_P = 0 is projected
    SGD (its update is η·(1·g + 0·…)); ρ and K_P are per-run arrays. So one call trains
    ``augmented`` with ``--sweep penalty=0,ρ`` for both formulations and ``nupi`` with
    ``--sweep nupi_kp=0,K_P`` for both dual optimisers (same base rate), each × the dual step
    sizes × seeds. ``combo_of`` maps a run's hyperparameters back to its combination."""

    combos: tuple[Combo, ...]
    formulation: str  # the runner's --formulation
    dual_optimizer: str  # the runner's --dual-optimizer ("-": the penalty's)
    update: str
    merged_formulations: bool = False  # penalty 0 = lagrangian, the other = augmented
    merged_duals: bool = False  # nupi_kp 0 = sgd, the other = nupi

    @property
    def slug(self) -> str:
        if len(self.combos) == 1:
            return self.combos[0].slug
        forms = "+".join(dict.fromkeys(c.formulation for c in self.combos))
        duals = "+".join(dict.fromkeys(c.dual_optimizer for c in self.combos))
        return f"{forms}-{duals}-{self.update}"

    @property
    def label(self) -> str:
        return " & ".join(c.label for c in self.combos)

    @property
    def swept(self) -> str:
        return self.combos[0].swept

    def combo_of(self, hparams: dict) -> Combo:
        form = self.formulation
        if self.merged_formulations:
            form = "lagrangian" if not hparams.get("penalty") else "augmented"
        dual = self.dual_optimizer
        if self.merged_duals:
            dual = "sgd" if not hparams.get("nupi_kp") else "nupi"
        return Combo(form, dual, self.update, hparams.get("epsilon_schedule") or "constant")

    @property
    def schedules(self) -> tuple[str, ...]:
        """The ε schedules of this call's combinations: lanes of its one program."""
        return tuple(dict.fromkeys(c.schedule for c in self.combos))


def calls(setting: Setting, combos: list[Combo], nupi_kp: float) -> list[Call]:
    """``combos`` grouped into runner calls that share one compiled program (see :class:`Call`),
    in the order of their first combination."""
    families: dict[tuple, list[Combo]] = {}
    for c in combos:  # ε schedules are lanes: a combination's schedules share its call
        if not setting.merge_calls:
            family = (c.formulation, c.dual_optimizer)
        elif c.formulation == "penalty":
            family = ("penalty", c.dual_optimizer)
        elif (
            c.dual_optimizer in ("sgd", "nupi")
            and nupi_kp > 0
            and (setting.dual_lr["sgd"] == setting.dual_lr["nupi"])
        ):
            family = ("multipliers", "sgd+nupi")
        else:
            family = ("multipliers", c.dual_optimizer)
        families.setdefault((*family, c.update), []).append(c)
    out = []
    for group in families.values():
        forms = {c.formulation for c in group}
        duals = {c.dual_optimizer for c in group}
        out.append(
            Call(
                combos=tuple(group),
                formulation="augmented" if "augmented" in forms else group[0].formulation,
                dual_optimizer="nupi" if "nupi" in duals else group[0].dual_optimizer,
                update=group[0].update,
                merged_formulations=len(forms) > 1,
                merged_duals=len(duals) > 1,
            )
        )
    return out
