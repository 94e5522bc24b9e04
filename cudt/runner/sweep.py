"""``--sweep NAME=V1,V2,...``: hyperparameter sweeps trained as one program.

Every sweepable hyperparameter (:data:`cudt.runner.hparams.SWEEPABLE`) is an array in the train
state or in the batch, so the Cartesian product of the swept values × the seeds is one stack of
runs, vmapped over by one compiled step per model structure. ERM runs are swept only over what
changes them (``lr``, ``gamma_train``): the constraint hyperparameters do not, so they are not
repeated. Every run carries ``hparams``, the values of every sweepable field it trained with
(None for a constraint hyperparameter of an ERM run: it has none).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from cudt.errors import UsageError
from cudt.knobs import KNOBS, TUNED_BY
from cudt.runner.hparams import (
    CONSTRAINT_ONLY,
    SWEEPABLE,
    chance_offset,
    is_reference,
    normalize_epsilon_schedule,
    normalize_reference,
    parse_epsilon_schedule,
)

__all__ = [
    "RunSpec",
    "canonical_items",
    "canonical_model_hparams",
    "canonical_sweeps",
    "distinct_values",
    "expand_runs",
    "is_given",
    "model_defaults",
    "parse_model_hparams",
    "parse_sweeps",
    "selected_kinds",
    "swept_suffix",
    "tuned_grid",
    "tuned_names",
]

SHORT = {k.name: k.short for k in KNOBS}  # the label of each in run names: eps=0.05


def _parse_value(cfg, name: str, text: str, flag: str = "--sweep"):
    """One swept value, checked like the flag itself (``flag``: where it came from)."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    if name == "reference":
        if not is_reference(text):
            raise ValueError(
                f"{flag} reference: {text!r} is not chance, chance+X, none or a finite number"
            )
        return normalize_reference(text)
    if name == "epsilon_schedule":
        try:
            parse_epsilon_schedule(text, cfg.steps)
            return normalize_epsilon_schedule(text)
        except ValueError as e:
            raise ValueError(f"{flag} epsilon_schedule: {e}") from None
    if name == "resilience" and text.lower() == "none":
        if cfg.resilience_mode == "slack":
            raise ValueError(
                f"{flag} resilience: none is not allowed with --resilience-mode slack (explicit "
                "slacks need an alpha): drop none or use --resilience-mode decay"
            )
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag} {name}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag} {name}: values must be finite numbers, got {text}")
    check = fields[name].metadata["check"]
    if not check.ok(value):
        raise ValueError(
            f"{flag} " + check.message(name, value, is_float=True, many=True).replace("_", "-")
        )
    return value


def _canonical_value(name: str, text: str):
    """What a swept value ``text`` names, as :func:`_parse_value` returns a valid one (a number,
    the canonical spelling of a reference or an ε schedule, None for resilience none); text
    that is none of these as it stands. Checks nothing."""
    if name == "reference":
        return normalize_reference(text) if is_reference(text) else text
    if name == "epsilon_schedule":
        try:
            return normalize_epsilon_schedule(text)
        except ValueError:
            return text
    if name == "resilience" and text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def canonical_sweeps(items) -> tuple[tuple[str, tuple], ...]:
    """The lanes ``--sweep`` items name (``("dual-lr=1e-3", "epsilon=0.1, 0.2")``), however
    spelt: ``(name, values)`` in the order they form lanes, names with underscores, values as
    parsed, a value repeated or an empty item ignored, as cudt formed lanes before refusing
    them (so a config saved then compares as its lanes). What a resume compares
    (:func:`cudt.runner.output.open_output`'s ``canonical``); checks nothing."""
    out = []
    for item in items:
        name, _, values = str(item).partition("=")
        name = name.strip().replace("-", "_")
        texts = [v.strip() for v in values.split(",") if v.strip()]
        out.append((name, tuple(dict.fromkeys(_canonical_value(name, t) for t in texts))))
    return tuple(out)


def canonical_model_hparams(items) -> dict[str, dict[str, Any]]:
    """The values ``--model-hparams`` items give (``("ut:epsilon=5e-2, dual-lr=100",)``),
    however spelt: ``{model: {name: value}}``, names with underscores, values as
    :func:`parse_model_hparams` reads them, in any order (a table: no lanes). What a resume
    compares (:func:`cudt.runner.output.open_output`'s ``canonical``); checks nothing."""
    table: dict[str, dict[str, Any]] = {}
    for item in items:
        model, _, rest = str(item).partition(":")
        values = table.setdefault(model.strip(), {})
        for pair in (p.strip() for p in rest.split(",")):
            name, _, text = pair.partition("=")
            name = name.strip().replace("-", "_")
            if pair:
                values[name] = _canonical_value(name, text.strip())
    return table


def canonical_items(items) -> tuple[str, ...]:
    """``--sweep`` items spelt as :func:`canonical_sweeps` reads them (``("dual_lr=0.001",
    "epsilon=0.1,0.2")``): the same lanes, each value once, so a saved config from before
    :func:`parse_sweeps` refused a repeat or an empty value is read back as what it trained."""

    def spelt(value) -> str:
        return "none" if value is None else repr(value) if isinstance(value, float) else value

    return tuple(
        f"{name}={','.join(spelt(v) for v in values)}" for name, values in canonical_sweeps(items)
    )


def parse_sweeps(cfg) -> dict[str, tuple]:
    """``{name: values}`` from ``cfg.sweep`` (``("epsilon=0.05,0.1", "lr=1e-3,3e-4")``), in the
    order given; a ValueError names a malformed item, an unknown name, a bad value, an empty
    one (``0.1,,0.2``) or a repeated one (``0.1,1e-1``), which would train fewer lanes than
    the values given."""
    sweeps: dict[str, tuple] = {}
    for item in cfg.sweep:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"--sweep {item!r} must be NAME=V1,V2,... (e.g. epsilon=0.05,0.1)")
        if name not in SWEEPABLE:
            raise ValueError(f"--sweep {name} is not sweepable: choose from {', '.join(SWEEPABLE)}")
        if name in sweeps:
            raise ValueError(f"--sweep {name} is given twice: list all its values in one --sweep")
        texts = [v.strip() for v in values.split(",")]
        if not any(texts):
            raise ValueError(f"--sweep {name}= needs at least one value")
        sweeps[name] = distinct_values(
            f"--sweep {name}={','.join(texts)}",
            texts,
            lambda text, name=name: _parse_value(cfg, name, text),
            lambda value, name=name: _same_value(name, value),
        )
    return sweeps


def distinct_values(given: str, texts, parse, same=lambda value: value) -> tuple:
    """The values of lanes ``texts`` (one per comma of ``given``, the flag as written), each
    read by ``parse``; a ValueError names an empty one (``0.1,,0.2``) or a repeat (``0.1,1e-1``:
    ``same`` tells values apart), either of which would train a lane fewer than asked for."""
    if not all(texts):  # the user meant a value there
        raise ValueError(f"{given} has an empty value: drop the extra comma or give its value")
    parsed = [parse(text) for text in texts]
    seen = {}
    for text, value in zip(texts, parsed, strict=True):
        key = same(value)
        if key in seen:
            again = "" if text == seen[key] else f" (as {text})"
            raise ValueError(f"{given} repeats {seen[key]}{again}: list each value once")
        seen[key] = text
    return tuple(parsed)


def _same_value(name: str, value):
    """What tells a swept value from another: the value, but a reference's bound
    (``chance`` and ``chance+0`` are one)."""
    offset = chance_offset(value) if name == "reference" else None
    return ("chance", offset) if offset is not None else value


def parse_model_hparams(cfg) -> dict[str, dict[str, Any]]:
    """``{model: {name: value}}`` from ``cfg.model_hparams``
    (``("ut:epsilon=0.05,dual_lr=100",)``): a model's own values of sweepable hyperparameters,
    the paper's per-model settings (its Table 1). A ValueError names a malformed item, an
    unknown name or a bad value."""
    table: dict[str, dict[str, Any]] = {}
    for item in cfg.model_hparams:
        model, sep, rest = item.partition(":")
        model = model.strip()
        if not sep or not model:
            raise ValueError(
                f"--model-hparams {item!r} must be MODEL:NAME=V[,NAME=V...] "
                "(e.g. ut:epsilon=0.05,dual_lr=100)"
            )
        if model in table:
            raise ValueError(
                f"--model-hparams {model} is given twice: list all its values in one item"
            )
        values: dict[str, Any] = {}
        for pair in (p.strip() for p in rest.split(",")):
            if not pair:
                continue
            name, eq, text = pair.partition("=")
            name = name.strip().replace("-", "_")
            if not eq or not name or not text.strip():
                raise ValueError(f"--model-hparams {model}: {pair!r} must be NAME=VALUE")
            if name in values:  # the later value won, the earlier one lost without a word
                raise ValueError(f"--model-hparams {model}: {name} is given twice: give it once")
            if name not in SWEEPABLE:
                raise ValueError(
                    f"--model-hparams {model}: {name} is not a per-run hyperparameter: choose "
                    f"from {', '.join(SWEEPABLE)}"
                )
            values[name] = _parse_value(cfg, name, text.strip(), flag=f"--model-hparams {model}:")
        table[model] = values
    return table


def is_given(cfg, name: str, sweeps: dict[str, tuple]) -> bool:
    """Whether the user chose ``name``: swept, or set to a value other than the task's
    default (a flag the command line names at the default is pinned there already: its tuned
    grid emptied, :func:`cudt.runner.cli.config_from_args`). A value the user chose wins over a
    model's own (:func:`model_defaults`)."""
    default = {f.name: f.default for f in dataclasses.fields(cfg)}[name]
    return name in sweeps or getattr(cfg, name) != default


def model_defaults(cfg, model: str, sweeps: dict[str, tuple] | None = None) -> dict[str, Any]:
    """The values ``--model-hparams`` gives ``model``, less those the user chose
    (:func:`is_given`): what its runs train with instead of the flags' defaults."""
    sweeps = parse_sweeps(cfg) if sweeps is None else sweeps
    own = parse_model_hparams(cfg).get(model, {})
    return {n: v for n, v in own.items() if not is_given(cfg, n, sweeps)}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run: a model, ERM or constrained, a seed and its hyperparameters."""

    model: str
    constrained: bool
    seed: int
    hparams: tuple[tuple[str, Any], ...]  # every sweepable field, in SWEEPABLE order
    point: int  # index of the sweep point (among this kind's points)

    @property
    def hp(self) -> dict[str, Any]:
        return dict(self.hparams)

    @property
    def kind(self) -> str:
        return "constrained" if self.constrained else "ERM"


def base_hparams(cfg, lr: float) -> dict[str, Any]:
    hp = {name: getattr(cfg, name) for name in SWEEPABLE}
    hp["lr"] = lr
    # the settings of a formulation, constraint kind or dual optimiser that is not used, and
    # the multipliers' steps of a formulation without them: none (cudt.knobs: Knob.acts)
    hp |= {k.name: None for k in KNOBS if not k.acts(cfg)}
    if hp["reference"] is not None:
        hp["reference"] = normalize_reference(hp["reference"])
    hp["epsilon_schedule"] = normalize_epsilon_schedule(hp["epsilon_schedule"])
    return hp


def expand_runs(cfg, models, default_lr, kinds=None) -> list[RunSpec]:
    """Every run of ``cfg``: for each model, ERM then constrained (``kinds(model)``: which of
    them, default both), each sweep point, each seed. ``default_lr(model)`` gives the learning
    rate when ``cfg.lr`` is None. A model's own values (``--model-hparams``,
    :func:`model_defaults`) replace the flags' defaults; a sweep or a flag the user set wins."""
    sweeps = parse_sweeps(cfg)
    default = {f.name: f.default for f in dataclasses.fields(cfg)}["model_hparams"]
    if cfg.model_hparams != default:  # the user's own table must name models this run trains
        unknown = [m for m in parse_model_hparams(cfg) if m not in models]
        if unknown:
            # how a run trains another model: --models (video), --model (text), or not at all
            train = (
                f", or train it: --models {','.join((*cfg.models, unknown[0]))}"
                if hasattr(cfg, "models")
                else f", or train it: --model {unknown[0]}"
                if hasattr(cfg, "model")
                else ""
            )
            raise UsageError(
                f"--model-hparams names {unknown[0]}, which this run does not train (models: "
                f"{', '.join(models)}): drop it{train}"
            )
    twice = next((m for i, m in enumerate(models) if m in models[:i]), None)
    if twice is not None:  # its runs would train twice under one label
        raise UsageError(f"--models names {twice} twice: name each model once")
    _refuse_idle_tunes(cfg, models, sweeps)
    specs = []
    for model in models:
        own = model_defaults(cfg, model, sweeps)
        model_lr = own.pop("lr", None)
        # a model's own lr is there only when the user did not set --lr (model_defaults)
        lr = (
            model_lr
            if model_lr is not None
            else cfg.lr
            if cfg.lr is not None
            else default_lr(model)
        )
        for constrained in (False, True) if kinds is None else kinds(model):
            grid = {n: v for n, v in sweeps.items() if constrained or n not in CONSTRAINT_ONLY}
            # a model's own value (--model-hparams) is not tuned either
            grid |= {
                n: v for n, v in tuned_grid(cfg, sweeps, constrained, lr).items() if n not in own
            }
            names = list(grid)
            for point, combo in enumerate(itertools.product(*(grid[n] for n in names))):
                hp = base_hparams(cfg, lr) | own | dict(zip(names, combo, strict=True))
                if not constrained:
                    hp |= {n: None for n in CONSTRAINT_ONLY}
                items = tuple((n, hp[n]) for n in SWEEPABLE)
                for seed in cfg.seed_list:
                    specs.append(RunSpec(model, constrained, seed, items, point))
    return specs


def _refuse_idle_tunes(cfg, models, sweeps: dict[str, tuple]) -> None:
    """A :class:`UsageError` where a grid the user gave (``--tune-epsilon`` and the others, set
    to other than the task's default) tunes no model: each has its own value of it
    (``--model-hparams``, the text UT's ``epsilon=0.02`` by default), which is not tuned, so the
    flag was accepted and its values not trained (a grid of that value alone, or ``--tune-lr
    1``, asks for what is trained)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name, grid in TUNED_BY.items():
        values = getattr(cfg, grid, ())
        if not values or values == defaults.get(grid) or is_given(cfg, name, sweeps):
            continue
        own = [(m, model_defaults(cfg, m, sweeps).get(name)) for m in models]
        if not own or any(value is None for _, value in own):
            continue
        asked = {float(v) for v in values}
        if all(asked == ({1.0} if name == "lr" else {float(v)}) for _, v in own):
            continue
        model, value = own[0]
        flag = "--" + grid.replace("_", "-")
        raise UsageError(
            f"{flag} tunes no model: {', '.join(m for m, _ in own)} "
            f"{'trains its' if len(own) == 1 else 'train their'} own {name} (--model-hparams "
            f"{model}:{name}={value:g}), which is not tuned: pass --model-hparams {model}: "
            f"(no model's own values) to tune {name}, or drop {flag}"
        )


def tuned_grid(cfg, sweeps: dict[str, tuple], constrained: bool, lr: float) -> dict[str, tuple]:
    """The values a kind's runs train as lanes for the runner to choose from on validation
    (``--tune-epsilon`` × ``--tune-dual-lr`` for the constrained runs, ``--tune-lr`` factors of
    ``lr`` for ERM's: :data:`cudt.knobs.TUNED_BY`), unless the user set or swept that
    hyperparameter or the run does not read it (the dual rate under the penalty formulation,
    whose lanes would be equal): ``{name: values}``, or ``{}``."""
    grid = {}
    for knob in KNOBS:
        values = getattr(cfg, knob.tuned_by) if knob.tuned_by else ()
        # a constrained run tunes its own knobs; ERM those both kinds read (its learning rate)
        if not values or knob.constrained_only != constrained or not knob.acts(cfg):
            continue
        if not is_given(cfg, knob.name, sweeps):
            scale = 1.0 if knob.constrained_only else lr  # a shared knob's grid is factors
            grid[knob.name] = tuple(dict.fromkeys(float(scale * v) for v in values))
    return grid


def tuned_names(cfg, sweeps: dict[str, tuple]) -> list[str]:
    """The hyperparameters this run varies over lanes: the swept ones and the tuned ones (in
    ``SWEEPABLE`` order), which name its runs and columns."""
    tuned = set(tuned_grid(cfg, sweeps, True, 1.0)) | set(tuned_grid(cfg, sweeps, False, 1.0))
    return [n for n in SWEEPABLE if n in sweeps or n in tuned]


def selected_kinds(cfg, kinds: tuple[bool, ...]) -> tuple[bool, ...]:
    """The kinds of a model (``task.kinds``: False = ERM, True = constrained) that ``--kinds``
    keeps: all of them for ``both``."""
    if cfg.kinds == "both":
        return kinds
    return tuple(k for k in kinds if k == (cfg.kinds == "constrained"))


def swept_suffix(spec: RunSpec, swept: list[str]) -> str:
    """``eps=0.05 lr=0.001``: the swept values of a run (what tells it from its siblings)."""
    hp = spec.hp
    parts = [
        f"{SHORT[n]}={hp[n]:g}" if isinstance(hp[n], float) else f"{SHORT[n]}={hp[n]}"
        for n in swept
        if hp[n] is not None
    ]
    return " ".join(parts)


def label_suffix(label: str) -> str:
    """The swept values :func:`swept_suffix` put in a run's label, after its seed
    (``ut-3 constrained seed 1 eps=0.05 dlr=10`` → ``eps=0.05 dlr=10``; ``""`` where none): the
    legends' one reading of a label (:func:`cudt.runner.groups.name_group` writes it)."""
    _, sep, tail = label.partition(" seed ")
    rest = tail.split(maxsplit=1)
    return rest[1] if sep and len(rest) == 2 else ""
