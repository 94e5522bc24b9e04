"""Video denoising: ERM vs layerwise-descent constrained DUST and UT.

Run (embedded synthetic surveillance video, no download, a few minutes on a laptop CPU):

    python -m experiments.video_denoise

On UCSD Anomaly frames (``UCSDped2/Train/Train001/001.tif`` ...):

    python -m experiments.video_denoise --dataset ucsd --data-dir /data/UCSD_Anomaly_Dataset.v1p2

Writes ``results.json``, ``layer_loss.png`` and ``rmse_vs_gamma.png`` under ``--out`` (a fresh
``runs/video_denoise-<time>`` folder by default) and prints a summary table.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import field

from cudt.cli import config_from_args, run_cli


def _help(text: str):
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class Config:
    dataset: str = field(
        default="synthetic",
        metadata=_help(
            "synthetic (embedded generator), ucsd (UCSD Anomaly frame folders) or frames "
            "(generic root/{train,test}/<video>/<frame> folders)"
        ),
    )
    data_dir: str | None = field(default=None, metadata=_help("folder of the frames"))
    models: tuple[str, ...] = field(
        default=("dust", "ut"), metadata=_help("comma-separated models: dust, ut")
    )
    layers: int = field(default=3, metadata=_help("number of unrolled layers L"))
    steps: int = field(default=800, metadata=_help("training steps per run"))
    batch_size: int = field(default=32, metadata=_help("sequences per batch"))
    seq_len: int = field(default=8, metadata=_help("frames per sequence T"))
    gamma_train: float = field(
        default=0.5, metadata=_help("training perturbation: x + gamma * sigma_x * N(0, 1)")
    )
    test_gammas: tuple[float, ...] | None = field(
        default=None, metadata=_help("test perturbations (default 0..4 x gamma_train)")
    )
    seeds: int = field(default=2, metadata=_help("seeds per setting, trained together (vmap)"))
    seed: int = field(default=0, metadata=_help("first seed; also seeds the synthetic videos"))
    epsilon: float = field(default=0.1, metadata=_help("descent factor: l_l <= (1-eps) l_{l-1}"))
    reference: float | None = field(
        default=None,
        metadata=_help("bound C of the reference constraint E l_0 <= C (none by default)"),
    )
    resilience: float | None = field(
        default=None, metadata=_help("resilience alpha (None: hard constraints)")
    )
    resilience_mode: str = field(
        default="decay",
        metadata=_help(
            "decay (dual weight decay 1/alpha) or slack (explicit slacks, restarted every epoch)"
        ),
    )
    slack_lr: float = field(default=1e-2, metadata=_help("learning rate of explicit slacks"))
    lr: float = field(default=1e-3, metadata=_help("primal Adam learning rate"))
    dual_optimizer: str = field(default="adam", metadata=_help("adam (the paper) or sgd"))
    dual_lr: float = field(default=5e-2, metadata=_help("dual learning rate"))
    warmup_steps: int | None = field(
        default=None, metadata=_help("primal warm-up steps with duals frozen (default: one epoch)")
    )
    tolerance: float = field(
        default=0.05,
        metadata=_help(
            "feasibility tolerance on held-out videos, relative to the previous layer's loss "
            "(constraints met on training batches show a gap of a few percent on other videos)"
        ),
    )
    dust_atoms: int = field(
        default=20, metadata=_help("DUST overcomplete DCT atoms per dimension (K = atoms^2)")
    )
    dust_dictionary: str = field(
        default="paper",
        metadata=_help(
            "paper (shared for ERM, one per layer when constrained), shared, or per-layer"
        ),
    )
    dust_threshold: float = field(default=0.01, metadata=_help("DUST soft threshold tau"))
    ut_a: float = field(
        default=0.25,
        metadata=_help(
            "UT attention step a (the published code uses 1: then layer 1 averages all T "
            "frames and no later layer can lower the loss on this data)"
        ),
    )
    ut_b: float = field(default=1.0, metadata=_help("UT feed-forward step b"))
    num_videos: int = field(default=20, metadata=_help("synthetic: number of videos"))
    num_frames: int = field(default=32, metadata=_help("synthetic: frames per video"))
    max_videos: int | None = field(
        default=None, metadata=_help("read at most this many videos per split (frame folders)")
    )
    chunk_steps: int = field(default=100, metadata=_help("steps per compiled chunk (log every)"))
    eval_batch_size: int = field(default=512, metadata=_help("sequences per evaluation batch"))
    checkpoint_every: int | None = field(
        default=None,
        metadata=_help("steps between checkpoints (default: every chunk)"),
    )
    keep_checkpoints: int = field(default=2, metadata=_help("checkpoints kept per group"))
    out: str | None = field(
        default=None,
        metadata=_help(
            "output folder (default: a fresh runs/video_denoise-<time>); rerunning "
            "with the same --out and flags resumes from its checkpoints"
        ),
    )
    resume: bool = field(
        default=False,
        metadata=_help(
            "require a checkpoint in --out to resume from (resuming is automatic "
            "when --out holds checkpoints of the same config)"
        ),
    )
    overwrite: bool = field(
        default=False, metadata=_help("discard results and checkpoints already in --out")
    )
    inject_nan: tuple[str, ...] | None = field(
        default=None,
        metadata=_help(
            "fault injection for testing divergence handling: MODEL,KIND,SEED,STEP "
            "(e.g. ut,constrained,0,30) makes that run's batch NaN at STEP"
        ),
    )

    def __post_init__(self):
        from cudt.video import DATASETS, MODELS

        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        need(
            self.dataset in DATASETS,
            f"--dataset {self.dataset!r} is unknown: choose from {', '.join(DATASETS)}",
        )
        need(
            self.dataset == "synthetic" or self.data_dir,
            f"--dataset {self.dataset} needs --data-dir pointing at the frame folders",
        )
        bad = [m for m in self.models if m not in MODELS]
        need(
            not bad,
            f"--models: unknown model {bad[0] if bad else ''!r}: choose from {', '.join(MODELS)}",
        )
        need(self.layers >= 1, f"--layers must be >= 1, got {self.layers}")
        need(self.steps >= 1, f"--steps must be >= 1, got {self.steps}")
        need(self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        need(self.seq_len >= 1, f"--seq-len must be >= 1, got {self.seq_len}")
        need(
            0 <= self.gamma_train < math.inf,
            f"--gamma-train must be a finite number >= 0, got {self.gamma_train}",
        )
        bad_gammas = [g for g in (self.test_gammas or ()) if not 0 <= g < math.inf]
        need(
            not bad_gammas,
            f"--test-gammas must all be finite numbers >= 0, got {bad_gammas[0] if bad_gammas else ''}",
        )
        need(self.seeds >= 1, f"--seeds must be >= 1, got {self.seeds}")
        need(self.seed >= 0, f"--seed must be >= 0, got {self.seed}")
        need(0 <= self.epsilon < 1, f"--epsilon must lie in [0, 1), got {self.epsilon}")
        need(0 < self.lr < math.inf, f"--lr must be a finite number > 0, got {self.lr}")
        need(
            0 < self.dual_lr < math.inf,
            f"--dual-lr must be a finite number > 0, got {self.dual_lr}",
        )
        need(
            self.dual_optimizer in ("adam", "sgd"),
            f"--dual-optimizer must be adam or sgd, got {self.dual_optimizer!r}",
        )
        need(
            self.resilience is None or self.resilience > 0,
            f"--resilience must be > 0, got {self.resilience}",
        )
        need(
            self.resilience_mode in ("decay", "slack"),
            f"--resilience-mode must be decay or slack, got {self.resilience_mode!r}",
        )
        need(
            self.resilience_mode == "decay" or self.resilience is not None,
            "--resilience-mode slack needs --resilience ALPHA",
        )
        need(
            0 < self.slack_lr < math.inf,
            f"--slack-lr must be a finite number > 0, got {self.slack_lr}",
        )
        need(
            self.warmup_steps is None or self.warmup_steps >= 0,
            f"--warmup-steps must be >= 0, got {self.warmup_steps}",
        )
        need(self.tolerance >= 0, f"--tolerance must be >= 0, got {self.tolerance}")
        need(self.dust_atoms >= 1, f"--dust-atoms must be >= 1, got {self.dust_atoms}")
        need(
            self.dust_dictionary in ("paper", "shared", "per-layer"),
            f"--dust-dictionary must be paper, shared or per-layer, got {self.dust_dictionary!r}",
        )
        need(self.dust_threshold >= 0, f"--dust-threshold must be >= 0, got {self.dust_threshold}")
        need(
            self.num_videos >= 3,
            f"--num-videos must be >= 3 (train/val/test split by video), got {self.num_videos}",
        )
        need(
            self.num_frames >= self.seq_len,
            f"--num-frames ({self.num_frames}) must be >= --seq-len ({self.seq_len})",
        )
        need(
            self.max_videos is None or self.max_videos >= 1,
            f"--max-videos must be >= 1 (or none for every video), got {self.max_videos}",
        )
        need(self.chunk_steps >= 1, f"--chunk-steps must be >= 1, got {self.chunk_steps}")
        need(
            self.eval_batch_size >= 1,
            f"--eval-batch-size must be >= 1, got {self.eval_batch_size}",
        )
        need(
            self.checkpoint_every is None or self.checkpoint_every >= 1,
            f"--checkpoint-every must be >= 1, got {self.checkpoint_every}",
        )
        need(
            self.keep_checkpoints >= 1,
            f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}",
        )
        need(
            not (self.resume and self.overwrite),
            "--resume and --overwrite contradict each other: pass one of them",
        )
        if self.inject_nan is not None:
            parts = self.inject_nan
            ok = (
                len(parts) == 4
                and parts[0] in MODELS
                and parts[1] in ("ERM", "constrained")
                and parts[2].isdigit()
                and parts[3].isdigit()
                and int(parts[3]) >= 1
            )
            need(
                ok,
                f"--inject-nan must be MODEL,KIND,SEED,STEP with KIND ERM or constrained "
                f"(e.g. ut,constrained,0,30), got {','.join(parts)!r}",
            )
            need(
                ok and self.seed <= int(parts[2]) < self.seed + self.seeds,
                f"--inject-nan seed {parts[2]} is not among the seeds trained "
                f"({self.seed}..{self.seed + self.seeds - 1})",
            )


def main(argv=None) -> int:
    cfg, _ = config_from_args(Config, argv, __doc__.split("\n\n")[0], "experiments.video_denoise")

    def go():
        from cudt.video import run_experiment

        run_experiment(cfg)

    return run_cli(go)


if __name__ == "__main__":
    sys.exit(main())
