"""The dual study's figures (one panel per setting):

* ``success.png``: per combination, the share of runs feasible and monotone, and the share
  infeasible or diverged, over every dual step size and seed;
* ``by_step_size.png``: successful runs vs the dual step size factor, one line per combination;
* ``multipliers.png``: the largest multiplier over training, at factor ×1, every seed, for
  plain projected ascent and the most successful combination.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper.dual_study.report import best
from experiments.paper.dual_study.settings import SETTINGS
from experiments.paper.figures import figure_note, grid_axes, save_figure

__all__ = ["write_figures"]


def _success(ax, summaries: list[dict], title: str) -> None:
    ordered = sorted(summaries, key=lambda s: s["ok"] / s["runs"])
    y = np.arange(len(ordered))
    ok = [s["ok"] / s["runs"] for s in ordered]
    failed = [s["failed"] / s["runs"] for s in ordered]
    ax.barh(y - 0.18, ok, height=0.36, color="tab:green", label="feasible and monotone")
    ax.barh(y + 0.18, failed, height=0.36, color="tab:red", label="infeasible or diverged")
    ax.set_yticks(y, [s["combo"].label + (" *" if s["baseline"] else "") for s in ordered])
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of runs (all step sizes and seeds)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(-1.6, len(ordered) - 0.5)  # an empty band at the bottom holds the legend
    ax.legend(fontsize=7, loc="lower right", ncol=2)


def _by_factor(ax, summaries: list[dict], title: str) -> None:
    from matplotlib import colormaps

    for i, s in enumerate(summaries):
        fs = sorted(s["by_factor"])
        share = [s["by_factor"][f][0] / s["by_factor"][f][1] for f in fs]
        # lines on the same shares stay visible: nudged along the step size, the shares exact
        # (nudged in the share, lines at 0 fell below it: figures audit)
        nudge = 10 ** (0.02 * (i - (len(summaries) - 1) / 2))
        ax.plot(
            [f * nudge for f in fs],
            share,
            marker="o",
            ms=3,
            lw=2.2 if s["baseline"] else 1.0,
            # 20 colours: the default's 19 combinations on the 10-colour cycle repeated 8 of them
            color="k" if s["baseline"] else colormaps["tab20"](i % 20),
            label=s["combo"].label,
        )
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("dual step size, × the base rate (the penalty: × its base ρ)")
    ax.set_ylabel("share feasible and monotone")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=6, ncol=2)


def _multipliers(ax, rows: list[dict], combos: list, title: str) -> None:
    colors = ["k", "tab:red", "tab:blue"]
    factor = min({r["factor"] for r in rows}, key=lambda f: abs(np.log(f)))
    for combo, color in zip(combos, colors, strict=False):
        first = True
        for r in rows:
            if r["combo"] != combo or r["factor"] != factor or not r.get("curves"):
                continue
            lam = np.asarray(r["curves"]["multipliers"], dtype=float)
            ax.plot(
                r["curves"]["step"],
                lam.max(axis=1),
                color=color,
                lw=1,
                label=combo.label if first else None,
            )
            first = False
    ax.set_xlabel("step")
    ax.set_ylabel("max λ over layers")
    ax.set_title(f"{title}, step size × {factor:g}", fontsize=10)
    ax.legend(fontsize=7)


def write_figures(opts, rows: list[dict], summaries: list[dict], out: Path) -> dict[str, Path]:
    names = [n for n in opts.settings if any(s["setting"] == n for s in summaries)]
    if not names:
        return {}

    def per_setting(draw, width: float, height: float, note: str, name: str) -> None:
        fig, axes = grid_axes(1, len(names), width, height)
        for ax, setting in zip(axes[0], names, strict=True):
            draw(ax, setting, SETTINGS[setting].title)
        figure_note(fig, note)
        paths[name] = out / f"{name}.png"
        save_figure(fig, paths[name])

    def mine(setting: str) -> list[dict]:
        return [s for s in summaries if s["setting"] == setting]

    def multipliers(ax, setting: str, title: str) -> None:
        b = best(mine(setting))
        shown = [s["combo"] for s in mine(setting) if s["baseline"]]
        if b is not None and b["combo"] not in shown:
            shown.append(b["combo"])
        _multipliers(ax, [r for r in rows if r["setting"] == setting], shown, title)

    paths: dict[str, Path] = {}
    height = 0.28 * max(len(summaries) / len(names), 4) + 1.5
    per_setting(
        lambda ax, s, title: _success(ax, mine(s), title),
        6.5,
        height,
        "* plain projected ascent: the Lagrangian, the task's own dual optimiser, simultaneous",
        "success",
    )
    per_setting(
        lambda ax, s, title: _by_factor(ax, mine(s), title),
        6.0,
        4.0,
        "black, thick: plain projected ascent; points on one share nudged apart along the step size",
        "by_step_size",
    )
    per_setting(
        multipliers,
        6.0,
        3.6,
        "every seed at the base step size: plain projected ascent and the most successful "
        "combination (the most runs feasible and monotone; ties: validation loss)",
        "multipliers",
    )
    return paths
