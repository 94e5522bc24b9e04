"""Where descent holds on validation and not on test: every layer of every run, read from
finished run folders' results.json (nothing is trained or chosen).

    python -m experiments.descent_gap runs/video-default runs/video-s234 --models dust,ut

The folders are pooled (the seeds of one job, as ``experiments.combine`` joins them). Per
layer l of each run: the ratio r_l = ℓ_l / ℓ_(l−1) on the training batches (the mean of the
last ``--last`` logged losses, ``curves``), on validation (``layer_loss_val``) and on test at
γ_train (``layer_loss``); its multiplier (the same mean of ``curves``' multipliers); whether the
test loss rises there. Layers whose constraint is not applicable (the previous state's
validation loss at the floor, as the runner reports it) are listed but left out of the summary.
Then, over the pooled folders, per model × class (ERM; constrained with the multiplier above
``--active``, "active"; constrained below it, "inactive"), the layers, the test rises, the
shifts val → test and train → test of r (mean ± sd), and the slack r − (1 − ε) on training
batches and on validation (0: the constraint holds with equality; constrained runs only): on
training batches at the ε the run trained at (ε + ``--epsilon-margin``, ``trained_epsilon``),
on validation at the ε it is judged at.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from cudt.errors import UsageError
from cudt.knobs import KNOBS, TUNED_BY
from cudt.metrics import applicable_steps
from cudt.runner.cli import OneLineParser, exit_process, run_cli
from cudt.runner.combine import CONFIG_FREE, load_results, run_data_seed, run_identity
from cudt.runner.config import RunConfig
from cudt.runner.record import at_gamma_train
from experiments.combine import TASKS

__all__ = ["layer_rows", "main", "summarise"]


def layer_rows(results: dict, models: set[str] | None = None, last: int = 10) -> list[dict]:
    """One dict per layer of each run of ``results`` (a results.json) whose model is in ``models``
    (every model when None): see the module docstring."""
    rows = []
    for run in results["runs"]:
        if (models and run["model"] not in models) or run.get("diverged"):
            continue
        test = np.asarray(at_gamma_train(run, "layer_loss"), dtype=float)
        val = np.asarray(run["layer_loss_val"], dtype=float)
        train = np.asarray(run["curves"]["layer_loss"], dtype=float)[-last:].mean(0)
        eps = run["hparams"]["epsilon"] if run["constrained"] else None
        # the ε its training batches were held to: ε + --epsilon-margin where one was given
        trained_eps = run.get("trained_epsilon") if run["constrained"] else None
        lam = (
            np.asarray(run["curves"]["multipliers"], dtype=float)[-last:].mean(0)
            if run["constrained"]
            else np.zeros_like(test)
        )
        # the runner's verdict of which constraints are judged (validation: an earlier state at
        # the loss floor, e.g. the UT's input at γ_train = 0, cannot be undercut), else its rule
        judged = run.get("constraint_applicable_val")
        judged = applicable_steps(val) if judged is None else np.asarray(judged, bool)[1:]
        for layer in range(1, len(test)):
            with np.errstate(divide="ignore", invalid="ignore"):  # a loss at 0: inf, said so
                ratio = {
                    k: float(v[layer] / v[layer - 1])
                    for k, v in (("train", train), ("val", val), ("test", test))
                }
            rows.append(
                {
                    "label": run["label"],
                    "model": run["model"],
                    "seed": run["seed"],
                    "epsilon": eps,
                    "trained_epsilon": eps if trained_eps is None else trained_eps,
                    "layer": layer,
                    "multiplier": float(lam[layer]),
                    "ratio": ratio,
                    "test_rises": bool(test[layer] >= test[layer - 1]),
                    "applicable": bool(judged[layer - 1]),
                }
            )
    return rows


def summarise(rows: list[dict], active: float = 0.01) -> dict[tuple[str, str], dict]:
    """``(model, class) -> {layers, rises, val_to_test, train_to_test, train_slack, val_slack}``,
    each shift and slack a ``(mean, sd)`` pair (slack None for ERM), over the layers whose
    constraint is applicable (the others' ratios divide by a loss at the floor: left out)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if not row.get("applicable", True):
            continue
        kind = (
            "ERM"
            if row["epsilon"] is None
            else ("active" if row["multiplier"] > active else "inactive")
        )
        groups.setdefault((row["model"], kind), []).append(row)
    out = {}
    for key, group in groups.items():
        r = {k: np.array([g["ratio"][k] for g in group]) for k in ("train", "val", "test")}

        def stat(x):
            return float(np.mean(x)), float(np.std(x))

        erm = key[1] == "ERM"
        # training batches against the bound they were trained to, validation against the
        # judged one (they differ by --epsilon-margin)
        edge = {
            k: None if erm else np.array([1 - g.get(f, g["epsilon"]) for g in group])
            for k, f in (("train", "trained_epsilon"), ("val", "epsilon"))
        }
        out[key] = {
            "layers": len(group),
            "rises": sum(g["test_rises"] for g in group),
            "val_to_test": stat(r["test"] - r["val"]),
            "train_to_test": stat(r["test"] - r["train"]),
            "train_slack": None if erm else stat(r["train"] - edge["train"]),
            "val_slack": None if erm else stat(r["val"] - edge["val"]),
        }
    return out


def _pm(pair) -> str:
    return "-" if pair is None else f"{pair[0]:+.3f} ± {pair[1]:.3f}"


def main(argv=None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.descent_gap", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folders", nargs="+", help="finished runs' --out folders")
    parser.add_argument("--models", default="", help="comma-separated models (default: all)")
    parser.add_argument(
        "--active",
        type=float,
        default=0.01,
        help="multiplier above which a constraint counts as active",
    )
    parser.add_argument("--last", type=int, default=10, help="logged training points averaged")
    parser.add_argument("--layers", action="store_true", help="also print every layer of every run")
    args = parser.parse_args(argv)
    return run_cli(lambda: _print_gap(args))


def _check(args) -> None:
    """The flags' values and the folders, before any is read: one line each."""
    if args.last < 1:
        raise UsageError(f"--last must be a whole number >= 1, got {args.last}")
    if not (np.isfinite(args.active) and args.active >= 0):
        raise UsageError(f"--active must be a finite number >= 0, got {args.active}")
    seen: dict[str, str] = {}
    for folder in args.folders:
        key = str(Path(folder).resolve())
        if key in seen:
            raise UsageError(
                f"{folder} is named twice (as {seen[key]}): its runs would count twice; "
                "pass each folder once"
            )
        seen[key] = folder


def _refuse_repeated_runs(folders, results) -> None:
    """A run that two folders both hold (a copied folder, two jobs of overlapping seeds on the
    same data, a later sweep's lane at a point another folder trained) would count twice:
    refused, as ``experiments.combine`` refuses it, by its seed and settings
    (:func:`cudt.runner.combine.run_identity`) and the folder's settings (:func:`_settings`),
    not its label (which names only the values its folder swept). Folders of other data sets
    (``--per-folder``'s held-out sets), or of other settings (``--steps``), hold other runs."""
    seen: dict[tuple, tuple[str, str]] = {}
    for folder, res in zip(folders, results, strict=True):
        config = res.get("config", {})
        data = (
            *(str(config.get(k)) for k in ("dataset", "data_dir")),
            _settings(res.get("experiment"), config),
        )
        for r in res["runs"]:
            # the draw of the data it read: seed 0 without --data-seed read --data-seed 0's
            draw = run_data_seed(config, int(r["seed"])) if "seed" in config else None
            key = (run_identity(r), *data, str(config.get("data_seed") if draw is None else draw))
            if key in seen:
                label, where = seen[key]
                held = (
                    f"{label} is in both {where} and {folder} (the same data)"
                    if label == r["label"]
                    else f"{r['label']} in {folder} is {label} in {where} (the same seed and "
                    "settings, on the same data)"
                )
                raise UsageError(
                    f"{held}: its layers would count twice; pass each run's folder once"
                )
            seen[key] = (r["label"], folder)


def _settings(experiment, config: dict) -> str:
    """What a folder's runs were trained with besides each run's own identity, as
    ``experiments.combine`` compares two folders' configs (an entry a later cudt added at what
    earlier versions did, ``ADDED``): all but :data:`CONFIG_FREE`, the flags that act on
    nothing, the knobs and models each run records itself (and the tune grids that chose
    them), what only the evaluation reads, and what each draw derived from its data (its data
    seed is in the key). Two folders that differ in ``--steps`` hold other runs."""
    cls = TASKS[experiment].config_cls if experiment in TASKS else RunConfig
    config = {**getattr(cls, "ADDED", {}), **config}
    flags = {f.name for f in dataclasses.fields(cls)}
    free = CONFIG_FREE | {k.name for k in KNOBS} | set(TUNED_BY.values())
    free |= {"models", "layers", *cls.EVALUATION_ONLY, *cls.idle_flags(config)}
    free |= set(config.get("data_derived", [])) - flags
    return json.dumps({k: v for k, v in config.items() if k not in free}, sort_keys=True)


def _print_gap(args) -> None:
    _check(args)
    models = {m for m in args.models.split(",") if m} or None
    results = [load_results(f) for f in args.folders]
    kinds = {res.get("experiment") for res in results}
    if len(kinds) > 1:
        raise UsageError(
            f"the folders hold runs of different experiments ({', '.join(sorted(map(str, kinds)))}"
            "): their ratios are not comparable; pass folders of one experiment"
        )
    _refuse_repeated_runs(args.folders, results)
    present = {r["model"] for res in results for r in res["runs"]}
    missing = sorted((models or set()) - present)
    if missing:
        raise UsageError(
            f"no run of model {', '.join(missing)} in {', '.join(map(str, args.folders))}: "
            f"pass --models from {', '.join(sorted(present))}"
        )
    rows = [row for res in results for row in layer_rows(res, models, args.last)]
    if args.layers:
        for row in rows:
            r = row["ratio"]
            print(
                f"{row['label']} layer {row['layer']}: λ {row['multiplier']:.3f}, r train "
                f"{r['train']:.3f} val {r['val']:.3f} test {r['test']:.3f}"
                + ("  test rises" if row["test_rises"] else "")
                + ("" if row["applicable"] else "  (not applicable: left out below)")
            )
    print(
        f"{'model':7s} {'class':8s} {'layers':>6s} {'rises':>5s} {'r val→test':>15s} "
        f"{'r train→test':>15s} {'train slack':>15s} {'val slack':>15s}"
    )
    for (model, kind), s in sorted(summarise(rows, args.active).items()):
        print(
            f"{model:7s} {kind:8s} {s['layers']:6d} {s['rises']:5d} "
            f"{_pm(s['val_to_test']):>15s} {_pm(s['train_to_test']):>15s} "
            f"{_pm(s['train_slack']):>15s} {_pm(s['val_slack']):>15s}"
        )
    skipped = sum(not row["applicable"] for row in rows)
    if skipped:
        print(
            f"left out: {skipped} layer(s) whose constraint is not applicable (the previous "
            "state's validation loss at the floor: the ratio divides by it)"
        )


if __name__ == "__main__":
    exit_process(main())
