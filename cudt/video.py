"""Video denoising with constrained unrolled transformers (the paper's Section 4).

A sample is one 16×16 patch location over T consecutive frames, ``[T, P]`` with P = 256 pixels in
[0, 1]. The model sees ``x̃ = x + γ·σ_x·n`` and returns every layer's reconstruction; the loss of
layer l is the per-sample MSE of state l to the clean patches. :func:`run_experiment` trains ERM
and constrained versions of each model, the seeds of each vmapped in one program, and writes
``results.json``, plots and a summary table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cudt import plots
from cudt.checkpoint import GroupCheckpointer
from cudt.constrained import DescentConfig
from cudt.data.video import VideoSplits, load_video_data, perturb
from cudt.errors import UsageError
from cudt.experiment import (
    Column,
    dual_optimizer,
    format_table,
    open_output,
    run_group,
    select_best,
    status_cell,
)
from cudt.io import fresh_run_dir, write_json_atomic
from cudt.loop import LoopResult, sample_indices
from cudt.metrics import descent_stats, feasibility, rmse_255
from cudt.models import DUST, UT, ut_project
from cudt.train import make_train_step

__all__ = [
    "DATASETS",
    "MODELS",
    "build_model",
    "evaluate_layer_losses",
    "format_video_table",
    "make_layer_losses",
    "run_experiment",
    "test_gamma_grid",
]

MODELS = ("dust", "ut")
DATASETS = ("synthetic", "ucsd", "frames")
KINDS = {False: "ERM", True: "constrained"}

# Fields that do not change what a run computes: a checkpoint stays valid when only these differ.
RESUME_IGNORES = ("out", "overwrite", "resume", "eval_batch_size")


def build_model(name: str, cfg, *, constrained: bool, patch_dim: int):
    """The module and the parameter projection applied after each optimizer step (or None)."""
    if name == "ut":
        model = UT(num_layers=cfg.layers, dim=patch_dim, a=cfg.ut_a, b=cfg.ut_b, init_scheme="dct")
        return model, ut_project
    if name == "dust":
        per_layer = {"paper": constrained, "shared": False, "per-layer": True}[cfg.dust_dictionary]
        model = DUST(
            num_layers=cfg.layers,
            patch_dim=patch_dim,
            atoms_per_dim=cfg.dust_atoms,
            per_layer_dictionary=per_layer,
            threshold=cfg.dust_threshold,
        )
        return model, None
    raise UsageError(f"unknown model {name!r}: choose from {', '.join(MODELS)}")


def make_layer_losses(model, gamma, sigma: float):
    """``(params, clean [B, T, P], key) -> [B, L+1]`` per-sample MSE of every layer's state."""

    def layer_losses(params, clean, key, first_index=0):
        noisy = perturb(clean, gamma, sigma, key, first_index)
        _, states = model.apply(params, noisy)  # [L+1, B, T, P]
        return jnp.mean((states - clean[None]) ** 2, axis=(2, 3)).T

    return layer_losses


def evaluate_layer_losses(
    model,
    params_stacked,
    data: np.ndarray,
    gammas,
    sigma: float,
    key: jax.Array,
    batch_size: int = 512,
) -> np.ndarray:
    """Per-sample layer losses of R stacked runs on ``data`` at every γ: [G, R, N, L+1].

    The noise of sample i at γ index g depends on ``(key, g, i)`` only: every run sees the same
    noisy inputs, whatever the batch size.
    """

    @jax.jit
    def eval_batch(params, clean, gamma, key, first):
        losses_fn = make_layer_losses(model, gamma, sigma)
        return jax.vmap(lambda p: losses_fn(p, clean, key, first))(params)  # [R, B, L+1]

    out = []
    for gi, gamma in enumerate(gammas):
        k = jax.random.fold_in(key, gi)
        parts = []
        for start in range(0, data.shape[0], batch_size):
            clean = jnp.asarray(data[start : start + batch_size])
            parts.append(
                np.asarray(
                    eval_batch(params_stacked, clean, jnp.float32(gamma), k, jnp.int32(start))
                )
            )
        out.append(np.concatenate(parts, axis=1))
    return np.stack(out)


def test_gamma_grid(gamma_train: float, explicit=None) -> list[float]:
    """The test γ grid: 0 to 4×γ_train (γ > γ_train is out of distribution)."""
    if explicit:
        return sorted({float(g) for g in explicit} | {float(gamma_train)})
    if gamma_train == 0:
        return [0.0, 0.05, 0.1, 0.15, 0.2, 0.3]
    return [round(f * gamma_train, 6) for f in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)]


def descent_config(cfg, *, constrained: bool, steps_per_epoch: int) -> DescentConfig:
    """The constraints of one group from the experiment config (warm-up: one epoch)."""
    warmup = steps_per_epoch if cfg.warmup_steps is None else cfg.warmup_steps
    return DescentConfig(
        num_layers=cfg.layers,
        epsilon=cfg.epsilon,
        reference=cfg.reference,
        resilience=cfg.resilience,
        resilience_mode=cfg.resilience_mode,
        slack_lr=cfg.slack_lr,
        slack_restart_steps=steps_per_epoch if cfg.resilience_mode == "slack" else None,
        warmup_steps=warmup if constrained else 0,
        constrained=constrained,
    )


def _fault_for(cfg, name: str, constrained: bool, seeds: list[int]):
    """``(run index, step)`` when ``cfg.inject_nan`` targets this group, else None."""
    if not cfg.inject_nan:
        return None
    model, kind, seed, step = cfg.inject_nan
    if model != name or kind != KINDS[constrained]:
        return None
    return seeds.index(int(seed)), int(step)


def _group_setup(name, constrained, cfg, data: VideoSplits, seeds):
    """The model, constraints, train step and initial stacked states of one group of runs."""
    patch_dim = data.train.shape[-1]
    model, project = build_model(name, cfg, constrained=constrained, patch_dim=patch_dim)
    steps_per_epoch = max(1, math.ceil(data.train.shape[0] / cfg.batch_size))
    descent = descent_config(cfg, constrained=constrained, steps_per_epoch=steps_per_epoch)
    losses_fn = make_layer_losses(model, jnp.float32(cfg.gamma_train), data.sigma)
    init, step = make_train_step(
        losses_fn,
        optax.adam(cfg.lr),
        dual_optimizer(cfg),
        descent,
        project_params=project,
        jit=False,
    )
    sample = jnp.zeros((1,) + data.train.shape[1:], jnp.float32)
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    init_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    def init_states(init_keys):
        return jax.vmap(lambda k: init(model.init(k, sample)))(init_keys)

    return model, descent, step, keys, init_keys, init_states


def _group_name(name: str, constrained: bool, cfg) -> str:
    return f"{name}-{cfg.layers} {KINDS[constrained]}"


def _check_checkpoints(cfg, data: VideoSplits, seeds, out) -> None:
    """Restores every group's latest checkpoint before anything is trained or written, so a
    corrupt checkpoint or one of another model is refused with nothing in ``out`` touched."""
    for name in cfg.models:
        for constrained in (False, True):
            folder = out.group_dir(_group_name(name, constrained, cfg).replace(" ", "-"))
            if not folder.is_dir():
                continue
            *_, init_keys, init_states = _group_setup(name, constrained, cfg, data, seeds)
            abstract = jax.eval_shape(init_states, init_keys)
            with GroupCheckpointer(folder, keep=cfg.keep_checkpoints) as checkpointer:
                if checkpointer.latest_step() is not None:
                    checkpointer.restore(abstract)


def _train_group(name, constrained, cfg, data: VideoSplits, train_x, seeds, out):
    model, descent, step, keys, init_keys, init_states = _group_setup(
        name, constrained, cfg, data, seeds
    )
    states = jax.jit(init_states)(init_keys)
    num_train = train_x.shape[0]

    def make_batch(key, step):
        return train_x[sample_indices(key, step, num_train, cfg.batch_size)]

    group = _group_name(name, constrained, cfg)
    result = run_group(
        step,
        states,
        keys,
        make_batch,
        name=group,
        labels=[f"{group} seed {s}" for s in seeds],
        num_steps=cfg.steps,
        chunk_steps=cfg.chunk_steps,
        checkpoint_dir=out.group_dir(group.replace(" ", "-")),
        checkpoint_every=cfg.checkpoint_every,
        keep_checkpoints=cfg.keep_checkpoints,
        fault=_fault_for(cfg, name, constrained, seeds),
    )
    return model, descent, result


def _summarise_group(
    name, constrained, cfg, data, model, descent, result: LoopResult, seeds, gammas, eval_key
):
    params = result.states.params
    gi_train = gammas.index(float(cfg.gamma_train))
    test_losses = evaluate_layer_losses(
        model, params, data.test, gammas, data.sigma, eval_key, cfg.eval_batch_size
    )  # [G, R, N, L+1]
    val_losses = evaluate_layer_losses(
        model,
        params,
        data.val,
        [cfg.gamma_train],
        data.sigma,
        jax.random.fold_in(eval_key, 99),
        cfg.eval_batch_size,
    )[0]  # [R, N, L+1]
    runs = []
    for r, seed in enumerate(seeds):
        diverged = bool(result.diverged[r])
        per_gamma = test_losses[:, r]  # [G, N, L+1]
        stats = descent_stats(per_gamma[gi_train])
        verdict = feasibility(
            val_losses[r].mean(0), np.asarray(descent.epsilon), cfg.reference, cfg.tolerance
        )
        rmse = [float(rmse_255(pg[:, -1].mean())) for pg in per_gamma]
        runs.append(
            {
                "model": name,
                "layers": cfg.layers,
                "constrained": constrained,
                "seed": int(seed),
                "gamma_train": float(cfg.gamma_train),
                "test_gamma": list(gammas),
                "rmse": rmse,
                "mean_rmse": float(np.mean(rmse)),
                "layer_loss": [pg.mean(0).tolist() for pg in per_gamma],
                "descent_rate": stats.descent_rate,
                "mean_ratio": stats.mean_ratio,
                "median_ratio": stats.median_ratio,
                "feasible": verdict.feasible and not diverged,
                "constraint_val": verdict.constraint,
                "relative_violation_val": verdict.relative_violation,
                "val_objective": float(val_losses[r].mean(0)[-1]),
                "multipliers": np.asarray(result.states.multipliers[r]).tolist(),
                "diverged": diverged,
                "diverged_at": result.diverged_at[r],
                "train_objective": [float(h["objective"][r]) for h in result.history],
                "train_steps": [int(h["step"]) for h in result.history],
            }
        )
    return runs


def format_video_table(runs) -> str:
    """The summary table: one row per run (``*`` marks the best feasible run of a group)."""

    def at_train(run):
        return run["rmse"][run["test_gamma"].index(run["gamma_train"])]

    columns = [
        Column("model", 5, lambda r: r["model"]),
        Column("L", 2, lambda r: str(r["layers"])),
        Column("kind", 11, lambda r: KINDS[r["constrained"]]),
        Column("seed", 4, lambda r: str(r["seed"])),
        Column("RMSE@γtr", 9, lambda r: f"{at_train(r):.3f}"),
        Column("meanRMSE", 9, lambda r: f"{r['mean_rmse']:.3f}"),
        Column("descent", 8, lambda r: f"{100 * r['descent_rate']:.1f}%"),
        Column("mean r", 7, lambda r: f"{r['mean_ratio']:.3f}"),
        Column("med r", 7, lambda r: f"{r['median_ratio']:.3f}"),
        Column("feasible", 9, status_cell),
        Column("max λ", 8, lambda r: f"{max(r['multipliers']):.3g}"),
    ]
    return format_table(runs, columns)


def experiment_fingerprint(cfg, data: VideoSplits) -> dict[str, Any]:
    """What a checkpoint of this experiment depends on: the config (minus output-only fields)
    and the data it was trained on."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUME_IGNORES}
    return config | {
        "data_source": data.source,
        "sigma_x": data.sigma,
        "train_shape": list(data.train.shape),
    }


def run_experiment(cfg, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the whole experiment of ``cfg`` (an ``experiments.video_denoise.Config``).

    Order matters for safety: the data is read (and any data error raised) before the output
    folder is touched; ``results.json`` is written last, so its presence means a complete run.
    """
    t0 = time.perf_counter()
    data = load_video_data(
        cfg.dataset,
        cfg.data_dir,
        seq_len=cfg.seq_len,
        num_videos=cfg.num_videos,
        num_frames=cfg.num_frames,
        seed=cfg.seed,
        max_videos=cfg.max_videos,
    )
    print(
        f"data: {data.source}: train {data.train.shape[0]} / val {data.val.shape[0]} / test "
        f"{data.test.shape[0]} sequences of {data.seq_len}x{data.train.shape[-1]}; "
        f"sigma_x = {data.sigma:.4f}; {time.perf_counter() - t0:.1f}s"
    )
    out = open_output(
        out_dir or cfg.out or fresh_run_dir("video_denoise"),
        experiment_fingerprint(cfg, data),
        overwrite=cfg.overwrite,
        resume=cfg.resume,
    )
    print(
        f"output: {out.path}"
        + (
            " (resuming)"
            if out.resuming
            else f" (if interrupted, rerun with --out {out.path} to resume)"
        )
    )
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    if out.resuming:
        _check_checkpoints(cfg, data, seeds, out)
    train_x = jnp.asarray(data.train)
    gammas = test_gamma_grid(cfg.gamma_train, cfg.test_gammas)
    eval_key = jax.random.key(10_000 + cfg.seed)
    runs: list[dict] = []
    train_seconds = {}
    for name in cfg.models:
        for constrained in (False, True):
            t = time.perf_counter()
            model, descent, result = _train_group(name, constrained, cfg, data, train_x, seeds, out)
            train_seconds[f"{name}-{KINDS[constrained]}"] = time.perf_counter() - t
            runs += _summarise_group(
                name, constrained, cfg, data, model, descent, result, seeds, gammas, eval_key
            )
    select_best(runs, "val_objective", higher_is_better=False)
    config = dataclasses.asdict(cfg) | {
        "sigma_x": data.sigma,
        "data_source": data.source,
        "test_gamma": gammas,
        "out": str(out.path),
    }
    results = {
        "experiment": "video_denoise",
        "config": config,
        "runs": runs,
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - t0,
    }
    gi = gammas.index(float(cfg.gamma_train))
    plots.plot_layer_losses(
        runs,
        out.path / "layer_loss.png",
        gamma_index=gi,
        title=f"mean test loss per layer at γ_train = {cfg.gamma_train}",
    )
    plots.plot_metric_vs_gamma(
        runs,
        out.path / "rmse_vs_gamma.png",
        key="rmse",
        ylabel="RMSE (0-255)",
        gamma_train=cfg.gamma_train,
        title="test RMSE vs perturbation (γ > γ_train: OOD)",
    )
    write_json_atomic(out.path / "results.json", results)
    print(format_video_table(runs))
    print(
        f"wrote {out.path / 'results.json'}, {out.path / 'layer_loss.png'}, "
        f"{out.path / 'rmse_vs_gamma.png'} in {results['wall_seconds']:.0f}s"
    )
    return results


def load_results(path: str | Path) -> dict:
    with open(path) as f:
        return json.load(f)
