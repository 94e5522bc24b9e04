"""What the accuracy tasks (text classification, LLM fine-tuning) report alike.

Their evaluation outputs are ``"losses"`` and ``"correct"`` (per sample and state: a hit, or a
fraction of hits for token accuracy); the metrics are accuracy per test γ (the last state), its
AUC over the γ grid, accuracy per state, validation accuracy at γ_train (the default best-run
score) and, where validation data is scored over a γ grid, its AUC (``val_auc``); the
figures are the per-state loss, accuracy vs γ and the per-sample ratio histograms.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from cudt import stats
from cudt.metrics import trapezoid_auc
from cudt.runner import plots
from cudt.runner.record import at_gamma_train
from cudt.runner.report import Column

__all__ = [
    "TEST_GAMMAS",
    "AccuracyReports",
    "feasibility_lines",
    "largest_epsilon_met",
    "paired_difference",
    "paired_with_erm",
    "test_gamma_grid",
]

# A fixed grid, so the accuracy AUC is comparable across γ_train (the paper's Table 4 AUCs, at
# most about 2, suggest a [0, 2] range).
TEST_GAMMAS = (0.0, 0.5, 1.0, 1.5, 2.0)


def test_gamma_grid(gamma_train: float, explicit=None) -> list[float]:
    """The test γ grid: ``explicit`` or 0, 0.5, 1, 1.5, 2 (γ > γ_train is OOD), with γ_train."""
    base = explicit if explicit else TEST_GAMMAS
    return sorted({float(g) for g in base} | {float(gamma_train)})


def _shown(value) -> str:
    """A number of the table, "n/a" where there is none (an AUC over one γ: NaN, null)."""
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.3f}"


class AccuracyReports:
    """Mixin of a :class:`cudt.runner.Task` whose ``eval_outputs`` give ``"correct"``."""

    loss_name = "cross-entropy"  # in the per-state loss plot's title and the footer
    accuracy_name = "accuracy"  # in the accuracy plot's axis label

    def selection_for(self, cfg) -> tuple[str, bool]:
        return ("val_accuracy", True)

    def test_gamma_grid(self, cfg, gamma_train: float) -> list[float]:
        return test_gamma_grid(gamma_train, cfg.test_gammas)

    def run_metrics(self, cfg, test, val, gammas, gamma_train):
        accuracy = [float(c[:, -1].mean()) for c in test["correct"]]
        return {
            "accuracy": accuracy,
            "auc": trapezoid_auc(gammas, accuracy),
            "layer_accuracy": [c.mean(0).tolist() for c in test["correct"]],
            "val_accuracy": float(val["correct"][:, -1].mean()),
        }

    def val_metrics(self, cfg, val, val_gammas, gamma_train):
        """Where validation data was scored at several γ: the validation accuracy at each and
        its AUC (the paper's best-run score, appendix B.3). Only then: validation scored at a
        swept γ_train's values alone is no test grid (its "AUC" would span those values)."""
        if getattr(cfg, "select", None) != "val-auc" or len(val_gammas) < 2:
            return {}
        accuracy = [float(c[:, -1].mean()) for c in val["correct"]]
        return {"val_accuracy_by_gamma": accuracy, "val_auc": trapezoid_auc(val_gammas, accuracy)}

    def metric_columns(self):
        return [
            Column("acc@γtr", 8, lambda r: f"{at_gamma_train(r, 'accuracy'):.3f}"),
            Column("acc@γmax", 8, lambda r: f"{r['accuracy'][-1]:.3f}"),
            Column("AUC", 6, lambda r: _shown(r.get("auc"))),
        ]

    def after_columns(self):
        # the verdict on validation data, as every verdict (the test split's is in results.json)
        return [Column("ℓ↓ val", 6, lambda r: "yes" if r["loss_decreases_val"] else "no")]

    @staticmethod
    def layer_loss_lines(runs, what: str = "loss") -> list[str]:
        """The mean test loss of every state at each run's γ_train, one line a run."""
        lines = [f"mean test {what} per state at gamma_train:"]
        for r in runs:
            losses = at_gamma_train(r, "layer_loss")
            lines.append(f"{r['label']}: " + " ".join(f"{v:.3f}" for v in losses))
        return lines

    def accuracy_figures(self, cfg, runs, ratios, out: Path, *, noise: str) -> list[Path]:
        """``layer_loss.png``, ``accuracy_vs_gamma.png`` and ``ratio_hist.png``; ``noise``
        names the perturbation in the accuracy plot's title."""
        paths = plots.plot_losses_and_metric(
            runs,
            out,
            cfg.gamma_train,
            loss=f"{self.loss_name} per state",
            xlabel="state l (0: the perturbed embeddings)",
            key="accuracy",
            ylabel=f"test {self.accuracy_name}",
            title=f"{self.accuracy_name} vs {noise} (γ > γ_train: OOD)",
        )
        paths.append(out / "ratio_hist.png")
        at = plots.gamma_train_text(runs, cfg.gamma_train)
        # pooled over seeds, never over γ_train (a panel each), nor over the lanes not chosen
        by_model, names = plots.pooled_ratios(runs, ratios)
        plots.plot_ratio_histograms(
            by_model,
            paths[2],
            title=f"per-sample ratios ℓ_l / ℓ_(l−1) on the test set at {at}",
            names=names,
        )
        return paths


def _setting(run: dict) -> tuple:
    """A run's setting: model, depth, γ_train and its swept values, without the seed."""
    hp = tuple(sorted((k, repr(v)) for k, v in run.get("hparams", {}).items()))
    return (run["model"], run["layers"], run["gamma_train"], hp)


def paired_with_erm(runs: list[dict]) -> list[tuple[str, list[dict], list[dict]]]:
    """Each constrained setting with its seeds and their ERM twins: ``(name, constrained,
    erm)``, the two lists aligned seed by seed. A constrained run's twin is the ERM run of the
    same model, depth, γ_train, learning rate and seed (the same data order and start); seeds
    without a twin, and diverged runs, are left out. ``name`` is the setting's swept values
    (empty for a single setting)."""
    alive = [r for r in runs if not r.get("diverged")]

    def twin_key(r):
        return (r["model"], r["layers"], r["gamma_train"], r["hparams"].get("lr"), r["seed"])

    erm = {twin_key(r): r for r in alive if not r["constrained"]}
    settings: dict[tuple, list[dict]] = {}
    for r in alive:
        if r["constrained"] and twin_key(r) in erm:
            settings.setdefault(_setting(r), []).append(r)
    out = []
    for group in settings.values():
        group = sorted(group, key=lambda r: r["seed"])
        name = re.sub(r"^.* seed \d+ ?", "", group[0]["label"])  # the swept values, if any
        out.append((name, group, [erm[twin_key(r)] for r in group]))
    return out


def paired_difference(a, b, *, seed: int = 0) -> stats.Interval:
    """The 95 % percentile-bootstrap interval of ``mean(a) − mean(b)``, ``a`` and ``b``
    ``[seeds, items]`` aligned (run ``s`` of ``a`` with its twin ``s`` of ``b``, item ``i`` the
    same prompt and noise): seeds are resampled, then items within each (two levels), with the
    same indices for both (:func:`cudt.stats.paired_bootstrap_interval`)."""
    return stats.paired_bootstrap_interval(
        np.asarray(a, np.float64), np.asarray(b, np.float64), seed=seed
    )


def _max_violation(run: dict) -> float:
    """The largest relative violation ``g_l / scale_l`` of a run's constraints on validation
    data (the constraints judged applicable only)."""
    rel = np.asarray(run["relative_violation_val"], np.float64)
    ok = np.asarray(run.get("constraint_applicable_val") or [True] * rel.size, bool)
    return float(np.max(rel[ok])) if ok.any() else float("-inf")


def largest_epsilon_met(run: dict) -> float | None:
    """The largest ε whose descent constraints ``ℓ_l ≤ (1 − ε)·ℓ_{l−1}`` a run meets on
    validation data, ``min_l (1 − ℓ_l / ℓ_{l−1})`` over the applicable constraints of its mean
    validation losses (``layer_loss_val``): negative when some state's readout rises, by that
    share. It reads one run at every ε at once (feasibility at 0 % tolerance is ``ε ≤`` it, with
    the reference bound met); None without the validation losses."""
    if run.get("layer_loss_val") is None:
        return None
    m = np.asarray(run["layer_loss_val"], np.float64)
    ok = np.asarray(run.get("constraint_applicable_val") or [True] * m.size, bool)[1:]
    if m.size < 2 or not ok.any():
        return None
    return float(np.min((1.0 - m[1:] / m[:-1])[ok]))


def feasibility_lines(runs: list[dict]) -> list[str]:
    """Each run's feasibility on validation data at 0 % tolerance and at the runner's: the
    largest relative violation (and, with the validation losses, the largest ε the run meets:
    :func:`largest_epsilon_met`), then a count of feasible seeds per setting and kind. ERM runs
    are judged against the constraints of their lane (they were not trained on them)."""
    lines = [
        "feasibility on validation data (largest relative violation g_l / scale_l; "
        "at 0 % tolerance | at the runner's tolerance):"
    ]
    counts: dict[str, list[int]] = {}
    for r in runs:
        worst = _max_violation(r)
        at_zero = bool(worst <= 0.0) and not r.get("diverged")
        at_tol = bool(r.get("feasible"))
        line = (
            f"{r['label']}: {100 * worst:+.2f}%  0%: {'yes' if at_zero else 'NO'} | "
            f"tol: {'yes' if at_tol else 'NO'}"
        )
        met = largest_epsilon_met(r)
        if met is not None:
            reference_met = float(np.asarray(r["relative_violation_val"])[0]) <= 0.0
            line += f" | descent met up to ε = {met:+.4f}" + (
                "" if reference_met else " (the reference bound is not)"
            )
        lines.append(line)
        name = re.sub(r" seed \d+", "", r["label"])
        c = counts.setdefault(name, [0, 0, 0])
        c[0] += at_zero
        c[1] += at_tol
        c[2] += 1
    lines += [
        f"{k}: feasible at 0 % {a} of {n} seeds, at tolerance {t} of {n}"
        for k, (a, t, n) in counts.items()
    ]
    return lines
