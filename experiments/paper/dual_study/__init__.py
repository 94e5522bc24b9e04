"""The dual-dynamics study (issue 19 item 4): which formulation × dual optimiser × update keeps
the descent constraints feasible, and the losses monotone, over a 100x range of dual step sizes.

For each setting (the video default: DUST-5; the constrained UT-5 on the same video; the text
default: MiniLM-6), each combination of ``--formulations``, ``--dual-optimizers`` and ``--updates``
has its dual step size swept over ``--dual-lr-factors`` × the setting's base rate for that
optimiser, × ``--seeds`` (``--kinds constrained``). Combinations that share a compiled program are
ONE runner call, as sweep points of it (:class:`~experiments.paper.dual_study.settings.Call`): the
Lagrangian is the augmented Lagrangian at ρ = 0 and projected SGD is nuPI at K_P = 0, so per update
one call trains {Lagrangian, augmented} × {SGD, nuPI}, one {Lagrangian, augmented} × Adam, and the
quadratic penalty one more (8 calls per setting instead of 20; not for text, whose lanes are
pretrained encoders too large to hold 60 at once: ``Setting.merge_calls``). The setting's ERM runs
(the reference of the ID change) are one more call. Every call has its own folder under ``--out``
(``<setting>/<combinations>``); rerunning the same command reuses finished calls and resumes
interrupted ones. The report (``study.md``, ``study.csv``, three PNGs) is
:mod:`experiments.paper.dual_study.report`; every verdict and choice in it reads validation data
only.

The base rates (:data:`SETTINGS`) put every optimiser's multipliers on the scale the setting's
default reaches: projected SGD and nuPI integrate ``η·g``, so their rate is ``λ*/|g|``-sized
(video: 1000, the default; text: 10); Adam moves ``λ`` by about ``η`` per step (video: 1; text:
0.1, the default). The augmented Lagrangian's ρ is the SGD rate (the method of multipliers:
the quadratic term adds one dual step's worth of ``λ`` to the primal gradient); the quadratic
penalty has no multipliers and its ρ is swept instead, around the value at which ``ρ·h``
reaches ``λ*`` within the feasibility tolerance.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from cudt.constrained import UPDATES
from cudt.errors import UsageError
from cudt.knobs import DUAL_STEPS
from cudt.optim import SCHEDULES
from cudt.runner.cli import config_main
from cudt.runner.config import FORMULATIONS, Needs, flag
from cudt.runner.hparams import normalize_epsilon_schedule, parse_epsilon_schedule
from experiments.paper.dual_study import figures, report
from experiments.paper.dual_study.settings import (
    DUAL_OPTIMIZERS,
    SETTINGS,
    Call,
    Combo,
    Setting,
    calls,
)
from experiments.paper.job import (
    SubRun,
    check_known,
    check_needs,
    devices_flag,
    figures_flag,
    need,
    open_job,
    scaled,
    train_subruns,
)
from experiments.paper.rows import fmt, unique

__all__ = [
    "SETTINGS",
    "Call",
    "Combo",
    "Setting",
    "StudyConfig",
    "calls",
    "combos",
    "main",
    "plan",
    "run_study",
]


def _trains_nupi(opts) -> bool:
    """Whether the study trains a nupi run (the penalty formulation has no dual optimiser)."""
    return "nupi" in opts.dual_optimizers and any(f != "penalty" for f in opts.formulations)


# K_P and nu are read by the nupi runs alone (as the runner refuses --nupi-kp without nupi): set
# where the study trains none, they would change nothing and the report would print them
_NUPI = Needs(
    _trains_nupi,
    lambda o, name: (
        f"{name} is read by the nupi runs only, and --dual-optimizers "
        f"{','.join(o.dual_optimizers)} --formulations {','.join(o.formulations)} train none: add "
        f"nupi to --dual-optimizers (and a formulation with multipliers), or drop {name}"
    ),
)


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """Flags of ``python -m experiments.dual_study``."""

    settings: tuple[str, ...] = flag(
        ("video", "ut", "text"), "settings: " + ", ".join(SETTINGS) + " (see the module doc)"
    )
    formulations: tuple[str, ...] = flag(FORMULATIONS, "formulations: " + ", ".join(FORMULATIONS))
    dual_optimizers: tuple[str, ...] = flag(
        DUAL_OPTIMIZERS,
        "dual optimisers: " + ", ".join(DUAL_OPTIMIZERS) + " (the penalty formulation has none)",
    )
    updates: tuple[str, ...] = flag(
        ("simultaneous", "alternating", "optimistic"),
        "primal-dual updates, of " + ", ".join(UPDATES) + " (the penalty formulation: the first)",
    )
    dual_lr_factors: tuple[float, ...] = flag(
        (0.1, 0.316, 1.0, 3.16, 10.0),
        "the dual step sizes, as multiples of each setting's base rate for the optimiser (the "
        "quadratic penalty: of its base rho)",
    )
    seeds: int = flag(3, "seeds per point")
    epsilon_schedules: tuple[str, ...] = flag(
        ("constant",),
        "how each run's epsilon reaches its value (the runner's --epsilon-schedule), e.g. "
        "constant,linear:0@200: every combination trains each, as lanes of its one program",
    )
    lr_schedule: str = flag(
        "constant", "primal learning-rate schedule of every run (constant: the study's question)"
    )
    nupi_kp: float = flag(5.0, "K_P of the nupi runs", needs=_NUPI)
    nupi_ema: float = flag(0.0, "EMA factor nu of the nupi runs", needs=_NUPI)
    steps: int | None = flag(None, "training steps per run (default: the setting's)")
    scale: str = flag(
        "default",
        "default (each setting's own data and steps) or tiny (seconds per run: tests, a laptop)",
    )
    devices: int | None = devices_flag()
    figures: bool = figures_flag("the study's figures")
    out: str | None = flag(
        None,
        "output folder (default: a fresh runs/dual_study-<time>); rerun with the same --out to "
        "reuse finished runs and resume interrupted ones",
    )
    overwrite: bool = flag(False, "retrain every run, discarding results already in --out")


def check(opts: StudyConfig) -> None:
    """Every flag, before anything is written (one-line UsageErrors)."""
    check_known("settings", "setting", opts.settings, tuple(SETTINGS))
    check_known("formulations", "formulation", opts.formulations, FORMULATIONS)
    check_known("dual-optimizers", "dual optimiser", opts.dual_optimizers, DUAL_OPTIMIZERS)
    check_known("updates", "update", opts.updates, UPDATES)
    check_known("scale", "scale", (opts.scale,), ("default", "tiny"))
    check_known("lr-schedule", "schedule", (opts.lr_schedule,), SCHEDULES)
    factors = opts.dual_lr_factors
    need(
        all(math.isfinite(f) and f > 0 for f in factors),
        "--dual-lr-factors must all be finite numbers > 0, got " + fmt(factors),
    )
    need(opts.seeds >= 1, f"--seeds must be >= 1, got {opts.seeds}")
    for text in opts.epsilon_schedules:
        try:
            parse_epsilon_schedule(text)
        except ValueError as e:
            raise UsageError(f"--epsilon-schedules {e}") from None
    need(opts.steps is None or opts.steps >= 1, f"--steps must be >= 1, got {opts.steps}")
    need(opts.devices is None or opts.devices >= 1, f"--devices must be >= 1, got {opts.devices}")
    need(
        math.isfinite(opts.nupi_kp) and opts.nupi_kp >= 0,
        f"--nupi-kp must be a finite number >= 0, got {opts.nupi_kp:g}",
    )
    need(0 <= opts.nupi_ema < 1, f"--nupi-ema must lie in [0, 1), got {opts.nupi_ema:g}")
    check_needs(opts)  # --nupi-kp, --nupi-ema: read by the nupi runs alone


def combos(opts: StudyConfig) -> list[Combo]:
    """The combinations of the flags, in their order; the quadratic penalty once (no dual
    optimiser; the first of ``--updates``)."""
    out = []
    schedules = unique(normalize_epsilon_schedule(t) for t in opts.epsilon_schedules)
    for form in unique(opts.formulations):
        for schedule in schedules:
            if form == "penalty":
                out.append(Combo(form, "-", unique(opts.updates)[0], schedule))
                continue
            for dual in unique(opts.dual_optimizers):
                for update in unique(opts.updates):
                    out.append(Combo(form, dual, update, schedule))
    return out


def _sweep_values(setting: Setting, combo: Combo, factors) -> tuple[str, tuple[float, ...]]:
    base = setting.base_rate(combo)
    return combo.swept, tuple(float(f"{base * f:.6g}") for f in unique(factors))


def _call_fields(setting: Setting, call: Call, opts: StudyConfig) -> dict[str, Any]:
    """The runner fields of one call: its formulation, update, dual optimiser and sweeps."""
    swept, values = _sweep_values(setting, call.combos[0], opts.dual_lr_factors)
    sweep = [f"{swept}={fmt(values)}"]
    fields: dict[str, Any] = dict(
        kinds="constrained", formulation=call.formulation, update=call.update
    )
    if call.formulation == "augmented":
        if call.merged_formulations:  # ρ = 0: the Lagrangian's lanes
            sweep.append(f"penalty={fmt((0.0, setting.augmented_penalty))}")
        else:
            fields["penalty"] = setting.augmented_penalty
    if call.dual_optimizer != "-":
        fields["dual_optimizer"] = call.dual_optimizer
        fields["dual_lr"] = setting.dual_lr[call.dual_optimizer]
    if call.dual_optimizer == "nupi":
        fields["nupi_ema"] = opts.nupi_ema
        if call.merged_duals:  # K_P = 0: projected SGD's lanes (one lane for --nupi-kp 0)
            sweep.append(f"nupi_kp={fmt(dict.fromkeys((0.0, opts.nupi_kp)))}")
        else:
            fields["nupi_kp"] = opts.nupi_kp
    if call.schedules != ("constant",):
        sweep.append(f"epsilon_schedule={','.join(call.schedules)}")
    return fields | {"sweep": tuple(sweep)}


def _config(setting: Setting, opts: StudyConfig, out: Path, **fields) -> Any:
    cls = setting.config_cls()
    # as recorded: dual steps in the loss's units, one ε per run (the rates are in SETTINGS)
    kw = dict(setting.fields) | dict(
        dual_scale="absolute", tune_epsilon=(), tune_lr=(), tune_dual_lr=()
    )
    kw = scaled(kw, opts, setting.tiny)
    kw |= dict(
        seeds=opts.seeds,
        lr_schedule=opts.lr_schedule,
        devices=opts.devices,
        figures=opts.figures,
        out=str(out),
        overwrite=opts.overwrite,
    )
    kw |= fields
    try:
        return cls(**kw)
    except ValueError as e:
        raise UsageError(f"{setting.name}: {e}") from None


def plan(opts: StudyConfig, out: Path) -> list[SubRun]:
    """One sub-run per (setting, combination), after each setting's ERM sub-run."""
    subs = []
    for name in unique(opts.settings):
        setting = SETTINGS[name]
        # Every dual setting is pinned, so a study does not change when a task's defaults do
        # (the ERM runs and the penalty record plain projected ascent; they use no multipliers,
        # and the penalty's call takes no value of their steps: recorded None, refused if set).
        plain = dict(
            formulation="lagrangian",
            update="simultaneous",
            dual_optimizer=setting.plain,
            dual_lr=setting.dual_lr[setting.plain],
            nupi_kp=0.0,
            nupi_ema=0.0,
        )
        folder = out / name / "erm"
        cfg = _config(setting, opts, folder, kinds="erm", **plain)
        subs.append(SubRun(f"{name} ERM", (name, None), cfg, folder, setting.resolved(cfg)))
        for call in calls(setting, combos(opts), opts.nupi_kp):
            folder = out / name / call.slug
            fields = plain | _call_fields(setting, call, opts)
            if call.formulation == "penalty":  # no multipliers: their steps' flags are refused
                fields = {k: v for k, v in fields.items() if k not in DUAL_STEPS}
            cfg = _config(setting, opts, folder, **fields)
            subs.append(
                SubRun(f"{name} {call.label}", (name, call), cfg, folder, setting.resolved(cfg))
            )
    return subs


def run_study(opts: StudyConfig) -> dict[str, Any]:
    """Trains (or reuses) every sub-run, then writes the report; returns ``{"rows", "summary",
    "markdown", "paths", "trained", "reused", "wall_seconds"}``."""
    t0 = time.perf_counter()
    check(opts)
    with open_job("dual study", opts, plan, what="runner calls") as (out, subs, todo):
        results = train_subruns(subs, lambda sub: SETTINGS[sub.key[0]].make_task())
        rows, summaries, erm = report.collect(subs, results)
        figure_paths = figures.write_figures(opts, rows, summaries, out) if opts.figures else {}
        written = report.write_report(
            opts, subs, rows, summaries, erm, figure_paths, out, time.perf_counter() - t0
        )
        print()
        print(written["headline"])
        print()
        print(f"wrote {', '.join(str(p) for p in written['paths'].values())}")
        return written | {
            "trained": len(todo),
            "reused": len(subs) - len(todo),
            "wall_seconds": time.perf_counter() - t0,
        }


def main(argv=None, doc: str = __doc__, prog: str = "experiments.dual_study") -> int:
    """The entry point: flags → the study; a bad flag or input is one line, status 2."""
    return config_main(StudyConfig, run_study, argv, doc, prog)
