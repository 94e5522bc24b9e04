"""LLM supervised fine-tuning with layerwise descent constraints (the paper's Section 6), as a task.

A Llama-family decoder (:mod:`cudt.models.llama`) is trained on instruction data in the
Alpaca format (:mod:`cudt.data.alpaca`), the loss on the response tokens only. The state of
layer ``l`` is the residual stream after block ``l`` (``l = 0``: the input embeddings), read
out with the model's own final norm and LM head; its loss is the mean token cross-entropy of
that readout over the response (METHOD.md, "Language modelling"), read out at exactly the
response tokens in buckets, never as ``[L+1, B, T, V]`` logits
(:func:`cudt.lm_loss.response_token_losses`). Robustness is the paper's: Gaussian noise
``γ·σ_E·n`` on every input embedding (``σ_E``: the std of the input embedding table at the
start), evaluated as the mean token
accuracy of held-out responses vs ``γ``; and greedy completions of held-out prompts by the ERM
and the constrained model with that noise on every token, generated ones included (a KV-cache
decoder, :meth:`cudt.models.llama.Decoder.generate`).

Without ``--checkpoint`` the model is a tiny decoder trained from scratch with a word-level
tokenizer of the generated instruction set (no download; small enough for a CPU). With ``--checkpoint`` a Hugging Face Llama / Mistral / Qwen2 folder or a GGUF file
is fine-tuned, with its own tokenizer (whole, or with ``--lora-rank`` the base frozen and
LoRA adapters trained); ``--data`` reads ``alpaca_data.json``, and
``--data tasks`` selects the generated task families of :mod:`cudt.data.instructions` (exact
answers, train and test disjoint by item) instead of the toy set; ``--train-data``,
``--val-data``, ``--test-data`` give a split as a file of your own (records it shares with
the training split are counted and warned about). An
instruction becomes a prompt through the model's chat template when it has one (the instruction
as the user turn; ``--prompt-format``), else the Stanford Alpaca template. ``--export DIR``
writes the chosen runs' models after training (:mod:`cudt.tasks.llm_export`).

``--lora-rank r`` trains LoRA adapters (:mod:`cudt.models.llama.lora`) instead of the whole
checkpoint: a run's parameters are ``{"lora": ...}``, the whole base is the group's frozen
argument (as the frozen embedding table is otherwise), and the forward is the decoder's own
with ``x A (s B)`` added on the adapted projections, so the descent constraints act on the
adapted model's states and a checkpoint holds the adapters and their optimiser states alone
(the base's digest is in its fingerprint). Defaults, as PEFT users would set them: alpha
``2r`` (a scale of 2 at every rank, alpha 16 at rank 8), every projection of every block
(q, k, v, o, gate, up, down: the MLP writes most of each block's update to the residual stream
the constraints read), learning rate 2e-4.

The task is four modules beside this one: its flags (:mod:`cudt.tasks.llm_config`), its data
(:mod:`cudt.tasks.llm_data`), its greedy completions and their scores
(:mod:`cudt.tasks.llm_completions`), and the export of trained models
(:mod:`cudt.tasks.llm_export`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.data.alpaca import TokenizedAlpaca
from cudt.errors import CudtError, UsageError
from cudt.io import atomic_write, json_digest
from cudt.lm_loss import (
    default_chunk_tokens,
    kept_logit_rows,
    layer_token_losses,
    response_token_losses,
)
from cudt.models.llama import Decoder, init_adapters
from cudt.runner.finished import run_data
from cudt.runner.run import evaluation_grids
from cudt.runner.task import GroupModel, RunBatch, Task, cut_in_batches
from cudt.tasks.accuracy import AccuracyReports, feasibility_lines
from cudt.tasks.llm_completions import completion_lines, greedy_completions, paired_lines
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.llm_data import LLMData, load_data, train_digest
from cudt.tasks.llm_export import (
    EveryRunDiverged,
    NoChosenRun,
    decoder_params,
    export_runs,
    lora_spec,
)

__all__ = ["LLMTask", "reference_state"]


def reference_state(cfg: LLMConfig, decoder: Decoder) -> int:
    """The first state of the problem (``--reference-state``): 0, the embeddings (the paper's
    ``E ℓ_0 ≤ C``), or 1, the first block's readout (``E ℓ_1 ≤ C``). ``auto`` is 1 exactly when
    ℓ_0 cannot move: a checkpoint whose tied head reads out its own frozen input embeddings, or
    LoRA adapters on any checkpoint (its embeddings, final norm and head all frozen, tied or
    not). A tied head's readout predicts the current token, not the next (SmolLM2: ℓ_0 ≈ 75
    nats against ln V = 10.8), so a bound on it could never hold and the descent step
    ℓ_1 ≤ (1 − ε) ℓ_0 would hold by itself (docs/results/llm.md has the measurement); a fixed
    ℓ_0 above the bound makes every constrained run infeasible."""
    if cfg.reference_state == "auto":
        if cfg.checkpoint is None:
            return 0
        if cfg.lora_rank is not None:
            return 1
        return int(not cfg.train_embeddings and decoder.config.tie_word_embeddings)
    return int(cfg.reference_state == "block1")


def overlap_lines(data: LLMData) -> list[str]:
    """A warning per pair of splits that share records (counted by
    :func:`cudt.data.alpaca.shared_records`): a held-out split with the training split, and the
    test split with validation, which chooses the runs the test split reports on; and per
    held-out split that repeats a record. They are kept, and said so."""
    lines = []
    for key, n in data.overlap.items():
        first, split = key.split("_")
        if n:
            what = "held out" if first == "train" else "held out from the choice on validation"
            lines.append(
                f"warning: {n} of {len(data.records[split])} {split} records are "
                f"{'training' if first == 'train' else 'validation'} records too (the same "
                f"instruction, input and output): their {split} scores are not {what}; remove "
                "them from one of the two"
            )
    for split, n in data.repeats.items():
        if n:
            lines.append(
                f"warning: {n} of {len(data.records[split])} {split} records repeat another "
                f"{split} record (the same instruction, input and output): each repeat weighs "
                f"again in the {split} scores; remove the repeats"
            )
    return lines


def lora_lines(cfg: LLMConfig, data: LLMData, n_params: int) -> list[str]:
    """What ``--lora-rank`` trains: the adapters' shape and size against the frozen base."""
    spec = lora_spec(cfg)
    if spec is None:
        return []
    shapes = data.decoder.config.param_shapes()["blocks"]
    size = sum(
        shapes[t]["kernel"][0] * spec.rank * (shapes[t]["kernel"][1] + shapes[t]["kernel"][2])
        for t in spec.targets
    )
    return [
        f"LoRA: rank {spec.rank}, alpha {spec.alpha:g} (scale {spec.scale:g}) on "
        f"{','.join(spec.targets)} of every block: {size / 1e6:.3f}M trainable parameters "
        f"({100 * size / n_params:.2f}% of the frozen base, digest {data.base_digest})"
    ]


def _check_lora_rank(cfg: LLMConfig, config) -> None:
    """``--lora-rank`` at most the smaller side of every adapted projection: an adapter's update
    ``A B`` has rank at most that, so a larger rank trains more parameters (more than the
    projection itself) and optimiser state for nothing (PEFT takes it without a word)."""
    spec = lora_spec(cfg)
    if spec is None:
        return
    shapes = config.param_shapes()["blocks"]
    sides = {t: shapes[t]["kernel"][1:] for t in spec.targets}
    name = min(sides, key=lambda t: min(sides[t]))
    n_in, n_out = sides[name]
    fit = [t for t in spec.targets if min(sides[t]) >= spec.rank]
    if spec.rank > min(n_in, n_out):
        raise UsageError(
            f"--lora-rank {spec.rank} exceeds the {name} projection of --checkpoint "
            f"{cfg.checkpoint} ({n_in} x {n_out}), whose update A B has rank at most "
            f"{min(n_in, n_out)}: pass --lora-rank {min(n_in, n_out)} or less"
            + (f", or --lora-targets {','.join(fit)}" if fit else "")
        )


def _masked_fraction(tokens: TokenizedAlpaca) -> float:
    return float(np.mean(tokens.truncated))


def _base_fingerprint(data: LLMData) -> dict[str, str]:
    """What the pretrained base a run starts from is, read from --checkpoint (a folder, or a
    GGUF file, whose contents may change behind the same path): its weights (``base_digest``)
    and, in ``base_config_digest``, its config as parsed (config.json, or the GGUF file's
    metadata: rope_theta, rms_norm_eps, tie_word_embeddings; another model over the same
    weights). Its tokenizer and chat template act through the training tokens
    (``train_digest``). A record from before the second (a ``*_digest`` one side lacks is not
    compared) resumes."""
    return {
        "base_digest": data.base_digest,
        "base_config_digest": json_digest(dataclasses.asdict(data.decoder.config)),
    }


class LLMTask(AccuracyReports, Task):
    name = "llm_sft"
    config_cls = LLMConfig
    loss_name = "token cross-entropy"
    accuracy_name = "mean token accuracy"
    warmup_cap = 0.25  # the default warm-up: one epoch, at most a quarter of the steps

    # -- data ------------------------------------------------------------------------------
    def load(self, cfg) -> LLMData:
        data = load_data(cfg)
        blocks, first = data.decoder.config.num_layers, reference_state(cfg, data.decoder)
        if blocks - first < 1:  # a 1-block checkpoint whose problem starts at block 1
            why = ""
            if cfg.reference_state == "auto":
                why = ": " + (
                    "LoRA freezes the embeddings' readout"
                    if cfg.lora_rank is not None
                    else "its tied head reads the frozen input embeddings"
                )
            raise UsageError(
                f"--checkpoint {cfg.checkpoint} has 1 block and the problem starts at its "
                f"readout (--reference-state {cfg.reference_state}{why}): no descent step is "
                "left; pass a model of 2 or more blocks, or --reference-state embeddings"
            )
        _check_lora_rank(cfg, data.decoder.config)
        return data

    def describe(self, cfg, data: LLMData) -> list[str]:
        c = data.decoder.config
        n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(data.decoder.params))
        origin = (
            "from scratch, word tokenizer of the data"
            if data.from_scratch
            else f"from {cfg.checkpoint}"
        )
        resp = float(data.tokens["train"].loss_mask.sum(1).mean())
        if data.response_capacity is None:
            readout = f"every state read out at all {cfg.max_length} positions"
        else:
            b = cfg.batch_size
            typical = data.response_keep or ()
            keep = typical[b - 1] if b <= len(typical) else None
            rows = kept_logit_rows(
                c.num_layers + 1 - reference_state(cfg, data.decoder),
                data.train_capacity[b - 1],
                c.vocab_size,
                bucket_tokens=cfg.bucket_tokens,
                chunk_tokens=self.chunk_tokens(cfg, data),
                keep_tokens=keep,
            )
            if not rows:  # they would not fit in --chunk-tokens: recomputed
                kept = "; the backward recomputes their logits"
            elif keep is not None:
                kept = f"; the backward keeps the logits of {keep}, as many as 99 % of batches hold"
            else:
                kept = ""
            readout = (
                "every state read out at exactly the response tokens (at most "
                f"{data.train_capacity[b - 1]} in a training batch of {b}{kept})"
            )
        return [
            f"data: {data.source}; {cfg.max_length} tokens, {resp:.1f} response tokens per "
            f"example, {100 * _masked_fraction(data.tokens['train']):.0f}% of train examples "
            f"truncated; {readout}",
            f"model: {c.model_type} {origin}: L = {c.num_layers} blocks, D = {c.hidden_size}, "
            f"{c.num_heads} heads ({c.num_kv_heads} kv), V = {c.vocab_size}, "
            f"{n_params / 1e6:.2f}M parameters, compute {cfg.compute_dtype}, "
            f"{data.prompt_format} prompts; noise std = gamma x "
            f"{data.noise_unit:.4g}"
            + (" (std of the input embeddings)" if cfg.noise_scale is None else ""),
            *lora_lines(cfg, data, n_params),
        ] + overlap_lines(data)

    def fingerprint(self, cfg, data: LLMData) -> dict[str, Any]:
        return {
            "source": data.source,
            "checkpoint": cfg.checkpoint,
            "vocab_size": data.decoder.config.vocab_size,
            "train_shape": list(data.tokens["train"].input_ids.shape),
            # the training tokens themselves: --num-val and --num-test are evaluation flags
            # only where they leave them unchanged (the generated task families; not a file,
            # whose val and test records are dealt before the training records)
            "train_digest": train_digest(data.tokens["train"]),
            "noise_unit": data.noise_unit,
            "prompt_format": data.prompt_format,
        } | ({} if data.base_digest is None else _base_fingerprint(data))

    def config_extras(self, cfg, data: LLMData) -> dict[str, Any]:
        return {
            "lr": cfg.lr if cfg.lr is not None else self.default_lr(cfg, "llm"),
            "noise_unit": data.noise_unit,
            "data_source": data.source,
            "decoder": data.decoder.config.to_dict(),
            "reference_bound": self.resolve_reference(cfg.reference, data),
            "reference_state": reference_state(cfg, data.decoder),
            "prompt_format": data.prompt_format,
            "data_overlap": data.overlap,
            "data_repeats": data.repeats,
        }

    def finish(self, cfg, data: LLMData, results: dict, out: Path) -> None:
        """``--export``: the chosen runs' models (:mod:`cudt.tasks.llm_export`)."""
        if cfg.export is None:
            return
        try:
            export_runs(
                self,
                cfg,
                run_data(self, cfg, data),  # each run's own draw of the data
                results,
                out,
                cfg.export,
                overwrite=cfg.overwrite_export,
            )
        except CudtError as err:
            again = f"python -m experiments.export_decoder {out} {cfg.export}"
            if isinstance(err, NoChosenRun):  # its own line says how: naming a run
                again += " --run LABEL"
            retry = "" if isinstance(err, EveryRunDiverged) else f"; export it again with {again}"
            raise UsageError(
                f"{err.cli or err} (the run itself is complete in {out}{retry})"
            ) from err

    def chance_level(self, data: LLMData) -> float:
        """ln V: the cross-entropy of a uniform guess over the vocabulary."""
        return math.log(data.decoder.config.vocab_size)

    def split_examples(self, data: LLMData, split: str, model=None):
        t = data.tokens[split]
        return {
            "input_ids": t.input_ids,
            "attention_mask": t.attention_mask,
            "labels": t.labels,
            "loss_mask": t.loss_mask.astype(np.float32),
        }

    def split_size(self, data: LLMData, split: str, model=None) -> int:
        return len(data.tokens[split])

    def eval_batches(self, data: LLMData, split: str, model: GroupModel, batch_size: int):
        n = self.split_size(data, split)
        return cut_in_batches(self.split_examples(data, split), n, min(batch_size, n))

    # -- models ----------------------------------------------------------------------------
    def model_names(self, cfg) -> list[str]:
        return ["llm"]

    def default_lr(self, cfg, name: str) -> float:
        """3e-3 for a tiny decoder trained from scratch, 1e-5 to fine-tune a checkpoint, 2e-4
        to train LoRA adapters (the LoRA and QLoRA papers' rate)."""
        if cfg.lora_rank is not None:
            return 2e-4
        return 3e-3 if cfg.checkpoint is None else 1e-5

    def chunk_tokens(self, cfg, data: LLMData) -> int:
        """``--chunk-tokens``, or :func:`cudt.lm_loss.default_chunk_tokens` for this vocabulary
        on this process's device: for one run at a time on a lone CPU (where the runner takes
        a group's runs in turn, :func:`cudt.loop.map_runs`), else for every run of the job
        batched together (vmapped on an accelerator or a mesh), which bounds any group."""
        if cfg.chunk_tokens is not None:
            return cfg.chunk_tokens
        alone = jax.default_backend() == "cpu" and jax.device_count() == 1
        runs = 1 if alone else len(self.run_specs(cfg))
        return default_chunk_tokens(data.decoder.config.vocab_size, runs=runs)

    def build(self, cfg, data: LLMData, name: str, structure) -> GroupModel:
        """The model of the problem from :func:`reference_state` on: its per-sample losses and
        evaluation outputs start at that state (the states before it are never read out), and
        the descent constraints run over the ``L − first`` steps after it."""
        dec = data.decoder
        first = reference_state(cfg, dec)
        unit = data.noise_unit
        dim = dec.config.hidden_size
        length = cfg.max_length
        pretrained = None if data.from_scratch else dec.params
        lora = lora_spec(cfg)
        if lora is not None:  # the whole base is frozen: only the adapters train
            frozen_table = dec.params
        else:
            frozen_table = None if cfg.train_embeddings else dec.params["embed"]
        chunk_tokens = self.chunk_tokens(cfg, data)

        def whole(params, frozen):  # the decoder's params: the frozen table or base put back
            return decoder_params(params, frozen, lora)

        def per_sample(params, ex, noise, last_only=False, train=False):
            states = dec.apply(params, ex["input_ids"], ex["attention_mask"], embed_noise=noise)
            # [1, B, T, D]: the last state's readout alone; else the problem's states only
            states = states[-1:] if last_only else states[first:]
            args = (
                states,
                lambda x: dec.final_norm(params, x),
                dec.head_matrix(params),
                ex["labels"],
                ex["loss_mask"],
            )
            if data.response_capacity is None:  # every position, in chunks
                return layer_token_losses(
                    *args, chunk_tokens=chunk_tokens, vocab_chunk=cfg.vocab_chunk
                )  # ce, acc: [B, L+1]
            # exactly the response tokens: a batch of b examples holds at most capacity[b - 1]
            # (training's drawn with replacement, evaluation's distinct)
            capacity = data.train_capacity if train else data.response_capacity
            b = min(states.shape[1], len(capacity))
            typical = data.response_keep or ()
            return response_token_losses(
                *args,
                capacity=capacity[b - 1],
                bucket_tokens=cfg.bucket_tokens,
                chunk_tokens=chunk_tokens,
                keep_tokens=typical[b - 1] if b <= len(typical) else None,
            )

        def on_tokens(noise, ex):  # padding gets no noise (it is masked out anyway)
            return (noise * ex["attention_mask"][..., None]).astype(dec.dtype)

        def layer_losses(params, batch: RunBatch, key):
            ex = batch.examples
            noise = jax.random.normal(key, (*ex["input_ids"].shape, dim)) * (batch.gamma * unit)
            return per_sample(whole(params, batch.frozen), ex, on_tokens(noise, ex), train=True)[0]

        def eval_outputs(params, frozen, ex, index, gamma, key, last_only=False):
            def example_noise(i):  # the noise of example i depends on (key, i) only
                return jax.random.normal(jax.random.fold_in(key, i), (length, dim))

            noise = jax.vmap(example_noise)(index) * (gamma * unit)
            ce, acc = per_sample(whole(params, frozen), ex, on_tokens(noise, ex), last_only)
            return {"losses": ce, "correct": acc}

        def init(key):
            if lora is not None:  # B = 0: every run starts as the checkpoint
                return {"lora": init_adapters(dec.config, lora, key)}
            if pretrained is not None:  # every run starts from the checkpoint
                params = jax.tree.map(jnp.array, pretrained)
            else:
                params = dec.config.init_params(key)
            if frozen_table is not None:
                params = {k: v for k, v in params.items() if k != "embed"}
            return params

        return GroupModel(
            name="llm",
            num_layers=dec.num_layers - first,
            init=init,
            layer_losses=layer_losses,
            eval_outputs=eval_outputs,
            eval_last=(
                None
                if cfg.states_at_every_gamma
                else functools.partial(eval_outputs, last_only=True)
            ),
            frozen=frozen_table,
            record={"blocks": dec.num_layers, **({"first_state": first} if first else {})},
        )

    def trained_outputs(self, cfg, data: LLMData, model, params, labels) -> list[dict]:
        """:func:`cudt.tasks.llm_completions.greedy_completions` of every run, up to the
        largest γ of the job's test grid, as the runner derives it."""
        test_gammas = evaluation_grids(self, cfg, self.run_specs(cfg))[0]
        return greedy_completions(cfg, data, model, params, labels, test_gammas)

    # -- evaluation and reports --------------------------------------------------------------
    def run_metrics(self, cfg, test, val, gammas, gamma_train):
        """The accuracy metrics, and each test prompt's token accuracy (the last state) at every
        test γ, ``prompt_accuracy [G][N]``: the paired intervals of :meth:`table_footer`."""
        out = super().run_metrics(cfg, test, val, gammas, gamma_train)
        out["prompt_accuracy"] = np.round(test["correct"][:, :, -1], 6).tolist()
        return out

    def table_footer(self, runs) -> str:
        lines = ["mean test token accuracy per gamma (final layer):"]
        for r in runs:
            acc = " ".join(
                f"{g:g}:{a:.3f}" for g, a in zip(r["test_gamma"], r["accuracy"], strict=True)
            )
            lines.append(f"{r['label']}: {acc}")
        lines += self.layer_loss_lines(runs, "cross-entropy")
        first = runs[0].get("first_state", 0) if runs else 0
        if first:
            lines.append(
                f"(states from {first}: the reference bound is on state {first}'s readout, "
                "--reference-state)"
            )
        lines += feasibility_lines(runs)
        scored = [r for r in runs if r.get("completion_scores")]
        if scored:
            lines.append(
                "greedy completions vs the reference (exact match, case-sensitive / ROUGE-L), "
                "per gamma:"
            )
            for r in scored:
                cells = " ".join(
                    f"{s['gamma']:g}:{s['exact']:.3f}/{s['rouge_l']:.3f}"
                    for s in r["completion_scores"]
                )
                lines.append(f"{r['label']}: {cells}")
        lines += paired_lines(runs)
        return "\n".join(lines + completion_lines(runs, first_only=True))

    def figures(self, cfg, runs, ratios, out: Path, gammas):
        return self.accuracy_figures(cfg, runs, ratios, out, noise="embedding noise")

    def outputs(self, cfg, runs, ratios, out: Path, gammas):
        if not any(r.get("completions") for r in runs):
            return []
        text = "\n".join(["# Greedy completions of held-out prompts", ""] + completion_lines(runs))
        data = (text + "\n").encode()
        atomic_write(out / "completions.md", lambda f: f.write(data))
        return [out / "completions.md"]
