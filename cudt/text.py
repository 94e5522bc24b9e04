"""Text classification with perturbed embeddings (the paper's Section 5).

A sample is a token sequence (``ids [T]``, ``mask [T]``) with a class label. The input token
embeddings are perturbed before the first block,

    x̃ = E[ids] + γ·σ_E·n,      n ~ N(0, I),  σ_E = std of the word-embedding table E

(``noise_scale`` replaces σ_E when given), and the model returns every state. ONE linear head,
shared by all states, reads each of them: the first token ([CLS] / ``<s>``) of a pretrained
encoder's states, the masked mean of the tokens of the UT's (the paper's choices); the loss of
state l is the cross-entropy of that prediction. all-MiniLM-L6-v2 (``minilm``) is read by the
mean of its tokens instead, the pooling it was trained with (its ``1_Pooling/config.json``): its
[CLS] was never trained to summarise, and in a short run the early blocks never learn to route
the label into it (states 1-4 stay at chance even when every state's loss is minimised).
Bodies:

* a pretrained BERT / DistilBERT / RoBERTa (:func:`cudt.load_encoder`), fine-tuned whole (blocks,
  position / type embeddings, embedding LayerNorm) except its word-embedding table, which stays
  frozen unless ``train_embeddings``: a trained table could grow its rows and so shrink the
  perturbation, whose scale is fixed from the pretrained table;
* a UT (:class:`cudt.models.UT`, Xavier init, projected after each step) over the same frozen
  word embeddings as the pretrained model (as the paper does), without position embeddings.

With ``granularity="sublayer"`` the attention and the MLP output of every block are each a state
(``2L+1`` states), else only block outputs (``L+1``). :func:`run_experiment` trains ERM and
constrained versions, the seeds of each vmapped in one program, and writes ``results.json``, plots
and a summary table.
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
from cudt.constrained import DescentConfig
from cudt.data.text import TextSplit, TextSplits, load_text_data, tokenize_split
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
from cudt.metrics import descent_stats, feasibility, trapezoid_auc
from cudt.models import UT, ut_project
from cudt.models.encoders import Encoder, load_encoder, minilm_path
from cudt.train import make_train_step

__all__ = [
    "GRANULARITIES",
    "MODELS",
    "PAPER_DESCENT",
    "TextClassifier",
    "TokenizedSplit",
    "build_text_model",
    "descent_config",
    "format_text_table",
    "make_evaluator",
    "make_layer_losses",
    "reference_bound",
    "run_experiment",
    "test_gamma_grid",
    "tokenize_splits",
]

MODELS = ("minilm", "bert", "distilbert", "roberta", "ut")
GRANULARITIES = ("block", "sublayer")
POOLINGS = ("first", "mean")
KINDS = {False: "ERM", True: "constrained"}
# The model_type a --checkpoint folder must hold for each --model (ut: any encoder's embeddings).
_MODEL_TYPES = {"minilm": "bert", "bert": "bert", "distilbert": "distilbert", "roberta": "roberta"}
# Appendix B.5 / Figure 12: constrained RoBERTa on IMDb, per-sample ratios on the test set.
PAPER_DESCENT = {"descent_rate": 0.708, "mean_ratio": 0.87, "median_ratio": 0.82}
PAPER_DESCENT_SOURCE = "paper, constrained RoBERTa on IMDb (Fig. 12)"

# Fields that do not change what a run computes: a checkpoint stays valid when only these differ.
RESUME_IGNORES = ("out", "overwrite", "resume", "eval_batch_size")

Batch = dict[str, jax.Array]  # ids [B, T] int32, mask [B, T] float32, labels [B] int32, types?


# --------------------------------------------------------------------------------------------
# Model: a body that returns every state, one shared linear head
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TextClassifier:
    """A pretrained encoder (or a UT over its word embeddings) and one linear head.

    Pure functions of a params pytree ``{"body": ..., "head": {"kernel" [D, C], "bias" [C]}}``;
    the object itself holds only constants (the encoder, the frozen word table). ``eq=False``
    keeps hashing by identity, so methods can be jitted.
    """

    name: str  # minilm | bert | distilbert | roberta | ut
    encoder: Encoder  # the pretrained model (for "ut": the source of tokenizer and embeddings)
    num_classes: int
    granularity: str = "block"
    ut: UT | None = None  # the body when name == "ut"
    train_embeddings: bool = False
    noise_unit: float = 1.0  # noise std at γ = 1 (σ_E by default)
    pooling: str = "first"  # the head's input: "first" token ([CLS] / <s>) or "mean" of tokens

    @property
    def table(self) -> jax.Array:
        """The pretrained word-embedding table E ``[V, D]``."""
        return self.encoder.params["embeddings"]["word_embeddings"]["embedding"]

    @property
    def dim(self) -> int:
        return self.encoder.config.hidden_size

    @property
    def blocks(self) -> int:
        """Transformer blocks (pretrained) or unrolled layers (UT)."""
        return self.ut.num_layers if self.ut is not None else self.encoder.num_layers

    @property
    def num_layers(self) -> int:
        """L of the constrained problem: states minus one (2 per block with sub-layers)."""
        return self.blocks * (2 if self.granularity == "sublayer" else 1)

    @property
    def uses_token_types(self) -> bool:
        return self.ut is None and self.encoder.config.type_vocab_size > 1

    def init(self, key: jax.Array) -> dict[str, Any]:
        """Initial params: the pretrained body (or a Xavier UT) and a fresh head from ``key``."""
        k_body, k_head = jax.random.split(key)
        if self.ut is not None:
            sample = jnp.zeros((1, 2, self.dim), jnp.float32)
            body: dict[str, Any] = {"ut": self.ut.init(k_body, sample)["params"]}
            if self.train_embeddings:
                body["word_embeddings"] = self.table
        else:
            body = jax.tree.map(jnp.asarray, self.encoder.params)
            if not self.train_embeddings:
                body["embeddings"] = {
                    k: v for k, v in body["embeddings"].items() if k != "word_embeddings"
                }
        # Small normal init (BERT's initializer_range): seeds differ in the head, not the body.
        kernel = 0.02 * jax.random.normal(k_head, (self.dim, self.num_classes), jnp.float32)
        head = {"kernel": kernel, "bias": jnp.zeros((self.num_classes,), jnp.float32)}
        return {"body": body, "head": head}

    def word_table(self, params) -> jax.Array:
        """The word-embedding table the model reads (trained copy or frozen constant)."""
        if not self.train_embeddings:
            return self.table
        if self.ut is not None:
            return params["body"]["word_embeddings"]
        return params["body"]["embeddings"]["word_embeddings"]["embedding"]

    def noise(self, key: jax.Array, batch: Batch, gamma) -> jax.Array:
        """Perturbation of the input token embeddings: ``γ·noise_unit·n`` on real tokens,
        ``[B, T, D]`` (padding is masked out of attention and pooling anyway)."""
        n = jax.random.normal(key, batch["ids"].shape + (self.dim,), jnp.float32)
        return n * (gamma * self.noise_unit) * batch["mask"][..., None]

    def states(self, params, batch: Batch, noise: jax.Array) -> jax.Array:
        """Every state ``[S, B, T, D]`` (S = L+1, or 2L+1 with sub-layers) for noisy inputs."""
        if self.ut is not None:
            x = self.word_table(params)[batch["ids"]] + noise  # [B, T, D]
            _, states = self.ut.apply({"params": params["body"]["ut"]}, x, batch["mask"])
            return states
        body = params["body"]
        if not self.train_embeddings:
            embeddings = dict(body["embeddings"], word_embeddings={"embedding": self.table})
            body = dict(body, embeddings=embeddings)
        return self.encoder.apply(
            body,
            batch["ids"],
            batch["mask"],
            embedding_noise=noise,
            granularity=self.granularity,
            token_type_ids=batch.get("types"),
        )

    def pool(self, states: jax.Array, mask: jax.Array) -> jax.Array:
        """The head's input per state ``[S, B, D]``: first token, or masked token mean."""
        if self.pooling == "first":
            return states[:, :, 0]
        m = mask.astype(states.dtype)[None, :, :, None]  # [1, B, T, 1]
        return jnp.sum(states * m, axis=2) / jnp.maximum(jnp.sum(m, axis=2), 1.0)

    def head(self, params, pooled: jax.Array) -> jax.Array:
        """The ONE shared readout: logits ``[..., C]`` of pooled features ``[..., D]``."""
        h = params["head"]
        return pooled.astype(jnp.float32) @ h["kernel"] + h["bias"]

    def logits(self, params, batch: Batch, noise: jax.Array) -> jax.Array:
        """Logits of every state ``[S, B, C]``."""
        return self.head(params, self.pool(self.states(params, batch, noise), batch["mask"]))

    def project(self):
        """The parameter projection after each optimizer step (the UT's), or None."""
        return ut_project if self.ut is not None else None


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample cross-entropy ``[S, B]`` of logits ``[S, B, C]`` and labels ``[B]``."""
    picked = jnp.take_along_axis(logits, labels[None, :, None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


def make_layer_losses(model: TextClassifier, gamma):
    """``(params, batch, key) -> [B, L+1]``: per-sample cross-entropy of every state at γ."""

    def layer_losses(params, batch: Batch, key: jax.Array) -> jax.Array:
        logits = model.logits(params, batch, model.noise(key, batch, gamma))
        return cross_entropy(logits, batch["labels"]).T

    return layer_losses


def build_text_model(
    name: str,
    *,
    num_classes: int,
    checkpoint: str | Path | None = None,
    granularity: str = "block",
    layers: int | None = None,
    train_embeddings: bool = False,
    noise_scale: float | None = None,
    pooling: str | None = None,
    ut_a: float = 1.0,
    ut_b: float = 1.0,
) -> TextClassifier:
    """Loads the pretrained encoder of ``name`` and wraps it (or a UT over its embeddings).

    ``minilm`` and ``ut`` default to the pip package all-MiniLM-L6-v2; ``bert``, ``distilbert``
    and ``roberta`` need ``checkpoint``, a Hugging Face folder of that architecture.
    ``pooling`` defaults to the paper's, first token for pretrained encoders and mean for the
    UT, except for ``minilm``: mean, the pooling all-MiniLM-L6-v2 was trained with.
    """
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}: choose from {', '.join(MODELS)}")
    if granularity not in GRANULARITIES:
        raise UsageError(
            f"unknown granularity {granularity!r}: choose from {', '.join(GRANULARITIES)}"
        )
    if pooling is None:
        pooling = "mean" if name in ("ut", "minilm") else "first"
    if pooling not in POOLINGS:
        raise UsageError(f"unknown pooling {pooling!r}: choose from {', '.join(POOLINGS)}")
    if checkpoint is None:
        if name not in ("minilm", "ut"):
            raise UsageError(
                f"--model {name} needs --checkpoint FOLDER, a Hugging Face {name} folder "
                "(config.json, model.safetensors, tokenizer.json)"
            )
        checkpoint = minilm_path()
    encoder = load_encoder(checkpoint)
    want = _MODEL_TYPES.get(name)
    if want is not None and encoder.config.model_type != want:
        raise UsageError(
            f"--model {name} but {checkpoint} holds a {encoder.config.model_type} model: pass "
            f"--model {'bert' if encoder.config.model_type == 'bert' else encoder.config.model_type}"
            f" or a {want} folder"
        )
    ut = None
    if name == "ut":
        ut = UT(
            num_layers=3 if layers is None else layers,
            dim=encoder.config.hidden_size,
            a=ut_a,
            b=ut_b,
            init_scheme="xavier",
            sublayer=granularity == "sublayer",
        )
    elif layers is not None and layers != encoder.num_layers:
        raise UsageError(
            f"--layers {layers} applies to --model ut only: {name} has {encoder.num_layers} "
            "blocks; drop --layers"
        )
    table = np.asarray(encoder.params["embeddings"]["word_embeddings"]["embedding"], np.float64)
    unit = float(table.std()) if noise_scale is None else float(noise_scale)
    return TextClassifier(
        name=name,
        encoder=encoder,
        num_classes=num_classes,
        granularity=granularity,
        ut=ut,
        train_embeddings=train_embeddings,
        noise_unit=unit,
        pooling=pooling,
    )


# --------------------------------------------------------------------------------------------
# Tokenized data and evaluation
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TokenizedSplit:
    """A tokenized split: ``ids``, ``mask`` ``[N, T]``, ``labels`` ``[N]``, ``types`` or None."""

    ids: np.ndarray
    mask: np.ndarray
    labels: np.ndarray
    types: np.ndarray | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def lengths(self) -> np.ndarray:
        return self.mask.sum(axis=1)

    def batch(self, index: np.ndarray | None = None, length: int | None = None) -> Batch:
        """The rows ``index`` (all by default), cut to the first ``length`` tokens."""
        index = np.arange(len(self)) if index is None else index
        t = self.ids.shape[1] if length is None else length
        out = {
            "ids": jnp.asarray(self.ids[index, :t]),
            "mask": jnp.asarray(self.mask[index, :t], jnp.float32),
            "labels": jnp.asarray(self.labels[index]),
        }
        if self.types is not None:
            out["types"] = jnp.asarray(self.types[index, :t])
        return out


def tokenize_splits(
    model: TextClassifier, data: TextSplits, max_length: int
) -> dict[str, TokenizedSplit]:
    """Tokenizes train / val / test with the model's tokenizer (pairs use its pair template)."""
    out = {}
    for name in ("train", "val", "test"):
        split: TextSplit = getattr(data, name)
        arrays = tokenize_split(
            model.encoder, split, max_length, return_token_type_ids=model.uses_token_types
        )
        types = arrays[2] if model.uses_token_types else None
        out[name] = TokenizedSplit(arrays[0], arrays[1], np.asarray(split.labels, np.int32), types)
    return out


def _length_batches(lengths: np.ndarray, batch_size: int, max_length: int, multiple: int = 16):
    """Batches of examples of similar length: ``(index [batch_size], count, padded length)``.

    Sorting by length and cutting each batch to its longest example (rounded up to ``multiple``)
    skips most padding; the last batch is filled with repeats of its first row so every batch
    has the same size (one compiled program per padded length).
    """
    order = np.argsort(lengths, kind="stable")
    for start in range(0, order.size, batch_size):
        index = order[start : start + batch_size]
        count = index.size
        length = min(max_length, multiple * math.ceil(max(int(lengths[index].max()), 1) / multiple))
        if count < batch_size:
            index = np.concatenate([index, np.full(batch_size - count, index[0])])
        yield index, count, length


def make_evaluator(model: TextClassifier, max_length: int, batch_size: int = 64):
    """``evaluate(params_stacked, split, gammas, key) -> (losses, correct)``, each
    ``[G, R, N, S]``: per-sample cross-entropy and whether the argmax is right, for every state,
    of R stacked runs at every γ.

    The noise of example i at γ index g depends on ``(key, g, i)`` only (drawn for
    ``max_length`` tokens, then cut): every run and group sees the same noisy inputs, whatever
    the batching. One evaluator serves every group of a model, so it compiles once per length.
    """

    @jax.jit
    def eval_batch(params_stacked, batch: Batch, index, gamma, key):
        length = batch["ids"].shape[1]

        def example_noise(i):
            n = jax.random.normal(jax.random.fold_in(key, i), (max_length, model.dim))
            return n[:length]

        noise = jax.vmap(example_noise)(index) * (gamma * model.noise_unit)
        noise = noise * batch["mask"][..., None]

        def one_run(params):
            logits = model.logits(params, batch, noise)  # [S, B, C]
            correct = jnp.argmax(logits, axis=-1) == batch["labels"][None]
            return cross_entropy(logits, batch["labels"]).T, correct.T  # [B, S] each

        return jax.vmap(one_run)(params_stacked)  # [R, B, S] each

    def evaluate(params_stacked, split: TokenizedSplit, gammas, key: jax.Array):
        num_runs = jax.tree.leaves(params_stacked)[0].shape[0]
        losses = np.zeros((len(gammas), num_runs, len(split), model.num_layers + 1), np.float32)
        correct = np.zeros(losses.shape, bool)
        for gi, gamma in enumerate(gammas):
            k = jax.random.fold_in(key, gi)
            for index, count, length in _length_batches(split.lengths, batch_size, max_length):
                loss, ok = eval_batch(
                    params_stacked,
                    split.batch(index, length),
                    jnp.asarray(index, jnp.int32),
                    jnp.float32(gamma),
                    k,
                )
                losses[gi, :, index[:count]] = np.asarray(loss)[:, :count].transpose(1, 0, 2)
                correct[gi, :, index[:count]] = np.asarray(ok)[:, :count].transpose(1, 0, 2)
        return losses, correct

    return evaluate


def test_gamma_grid(gamma_train: float, explicit=None) -> list[float]:
    """The test γ grid: ``explicit`` or 0, 0.5, 1, 1.5, 2 (γ > γ_train is OOD), with γ_train.

    A fixed grid, so the accuracy AUC is comparable across γ_train (the paper's Table 4 AUCs,
    at most about 2, suggest a [0, 2] range too).
    """
    base = explicit if explicit else (0.0, 0.5, 1.0, 1.5, 2.0)
    return sorted({float(g) for g in base} | {float(gamma_train)})


# --------------------------------------------------------------------------------------------
# Training groups and their summaries
# --------------------------------------------------------------------------------------------


def default_lr(cfg) -> float:
    """``cfg.lr``, or 1e-4 for pretrained encoders (fine-tuning) and 1e-3 for the UT."""
    if cfg.lr is not None:
        return cfg.lr
    return 1e-3 if cfg.model == "ut" else 1e-4


def warmup_steps(cfg, steps_per_epoch: int) -> int:
    """Primal warm-up: ``cfg.warmup_steps``, else one epoch capped at a quarter of the steps."""
    if cfg.warmup_steps is not None:
        return cfg.warmup_steps
    return min(steps_per_epoch, cfg.steps // 4)


def reference_bound(reference: str | float | None, num_classes: int) -> float | None:
    """The bound C of ``E ℓ_0 <= C``: ``"chance"`` is ln(num_classes), the cross-entropy of a
    uniform guess; ``"none"`` / None drops the constraint; anything else is a number.

    Without it the cheapest way to satisfy ``ℓ_1 <= (1 − ε) ℓ_0`` is to make state 0 worse:
    the first token of the embedding output carries no information about the label, so the
    head can only raise ℓ_0 above chance, and the multiplier of layer 1 pays it to.
    """
    if reference is None or str(reference).lower() == "none":
        return None
    if str(reference).lower() == "chance":
        return float(np.log(num_classes))
    value = float(reference)
    if not math.isfinite(value):
        raise UsageError(f"--reference must be chance, none or a finite number, got {reference}")
    return value


def descent_config(
    cfg, model: TextClassifier, *, constrained: bool, steps_per_epoch: int
) -> DescentConfig:
    """The constraints of one group: one per state transition of ``model``."""
    return DescentConfig(
        num_layers=model.num_layers,
        epsilon=cfg.epsilon,
        reference=reference_bound(cfg.reference, model.num_classes),
        resilience=cfg.resilience,
        resilience_mode=cfg.resilience_mode,
        slack_lr=cfg.slack_lr,
        slack_restart_steps=steps_per_epoch if cfg.resilience_mode == "slack" else None,
        warmup_steps=warmup_steps(cfg, steps_per_epoch) if constrained else 0,
        constrained=constrained,
    )


def group_name(model: TextClassifier, constrained: bool) -> str:
    return f"{model.name}-{model.num_layers} {KINDS[constrained]}"


def _train_group(model: TextClassifier, constrained: bool, cfg, train: TokenizedSplit, seeds, out):
    steps_per_epoch = max(1, math.ceil(len(train) / cfg.batch_size))
    descent = descent_config(cfg, model, constrained=constrained, steps_per_epoch=steps_per_epoch)
    init, step = make_train_step(
        make_layer_losses(model, jnp.float32(cfg.gamma_train)),
        optax.adam(default_lr(cfg)),
        dual_optimizer(cfg),
        descent,
        project_params=model.project(),
        jit=False,
    )
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    init_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    states = jax.jit(jax.vmap(lambda k: init(model.init(k))))(init_keys)
    device_train = train.batch()  # device-resident; batches are gathered inside the program

    def make_batch(key, step):
        index = sample_indices(key, step, len(train), cfg.batch_size)
        return jax.tree.map(lambda a: a[index], device_train)

    group = group_name(model, constrained)
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
    )
    return descent, result


def _decreases(losses) -> bool:
    """Mean loss strictly lower at every state than at the one before."""
    losses = np.asarray(losses, np.float64)
    return bool(np.all(np.isfinite(losses)) and np.all(np.diff(losses) < 0))


def _summarise_group(
    model: TextClassifier,
    constrained: bool,
    cfg,
    tokens,
    evaluate,
    descent,
    result: LoopResult,
    seeds,
    gammas,
    eval_key,
):
    params = result.states.params
    gi_train = gammas.index(float(cfg.gamma_train))
    test_losses, test_correct = evaluate(params, tokens["test"], gammas, eval_key)  # [G,R,N,S]
    val_losses, val_correct = evaluate(
        params, tokens["val"], [cfg.gamma_train], jax.random.fold_in(eval_key, 99)
    )
    runs = []
    for r, seed in enumerate(seeds):
        diverged = bool(result.diverged[r])
        per_gamma = test_losses[:, r]  # [G, N, S]
        stats = descent_stats(per_gamma[gi_train])
        verdict = feasibility(
            val_losses[0, r].mean(0), np.asarray(descent.epsilon), descent.reference, cfg.tolerance
        )
        accuracy = [float(c[:, -1].mean()) for c in test_correct[:, r]]
        layer_loss = [pg.mean(0).tolist() for pg in per_gamma]
        runs.append(
            {
                "model": model.name,
                "layers": model.num_layers,
                "blocks": model.blocks,
                "granularity": model.granularity,
                "constrained": constrained,
                "seed": int(seed),
                "gamma_train": float(cfg.gamma_train),
                "test_gamma": list(gammas),
                "accuracy": accuracy,
                "auc": trapezoid_auc(gammas, accuracy),
                "layer_loss": layer_loss,
                "layer_accuracy": [c.mean(0).tolist() for c in test_correct[:, r]],
                "loss_decreases": _decreases(layer_loss[gi_train]),
                "descent_rate": stats.descent_rate,
                "mean_ratio": stats.mean_ratio,
                "median_ratio": stats.median_ratio,
                "feasible": verdict.feasible and not diverged,
                "constraint_val": verdict.constraint,
                "relative_violation_val": verdict.relative_violation,
                "val_objective": float(val_losses[0, r].mean(0)[-1]),
                "val_accuracy": float(val_correct[0, r][:, -1].mean()),
                "multipliers": np.asarray(result.states.multipliers[r]).tolist(),
                "diverged": diverged,
                "diverged_at": result.diverged_at[r],
                "train_objective": [float(h["objective"][r]) for h in result.history],
                "train_steps": [int(h["step"]) for h in result.history],
            }
        )
    ratios = descent_stats(test_losses[gi_train].reshape(-1, test_losses.shape[-1])).ratios
    keep = ~np.repeat(np.asarray(result.diverged), len(tokens["test"]))
    return runs, ratios[keep].ravel()


# --------------------------------------------------------------------------------------------
# Table, fingerprint, the experiment
# --------------------------------------------------------------------------------------------


def _at_train(run, key):
    return run[key][run["test_gamma"].index(run["gamma_train"])]


_COLUMNS = (
    ("model", 8),
    ("L", 3),
    ("kind", 11),
    ("seed", 4),
    ("acc@γtr", 8),
    ("acc@γmax", 8),
    ("AUC", 6),
    ("descent", 8),
    ("mean r", 7),
    ("med r", 7),
    ("ℓ↓ all l", 8),
    ("feasible", 9),
    ("max λ", 8),
)


def format_text_table(runs, *, reference: bool = True) -> str:
    """The summary table, one row per run (``*``: best feasible run of its group by val
    accuracy), then the paper's per-sample descent figures in the same columns."""
    cells = (
        lambda r: r["model"],
        lambda r: str(r["layers"]),
        lambda r: KINDS[r["constrained"]],
        lambda r: str(r["seed"]),
        lambda r: f"{_at_train(r, 'accuracy'):.3f}",
        lambda r: f"{r['accuracy'][-1]:.3f}",
        lambda r: f"{r['auc']:.3f}",
        lambda r: f"{100 * r['descent_rate']:.1f}%",
        lambda r: f"{r['mean_ratio']:.3f}",
        lambda r: f"{r['median_ratio']:.3f}",
        lambda r: "yes" if r["loss_decreases"] else "no",
        status_cell,
        lambda r: f"{max(r['multipliers']):.3g}",
    )
    columns = [Column(h, w, c) for (h, w), c in zip(_COLUMNS, cells, strict=True)]
    table = format_table(runs, columns)
    if not reference:
        return table
    paper = {
        "model": "roberta",
        "kind": "constrained",
        "seed": "-",
        "descent": f"{100 * PAPER_DESCENT['descent_rate']:.1f}%",
        "mean r": f"{PAPER_DESCENT['mean_ratio']:.3f}",
        "med r": f"{PAPER_DESCENT['median_ratio']:.3f}",
    }
    ref_columns = [Column(h, w, lambda _, h=h: paper.get(h, "")) for h, w in _COLUMNS]
    ref_row = format_table([{}], ref_columns).splitlines()[-1]
    return f"{table}\n{ref_row}   <- {PAPER_DESCENT_SOURCE}"


def format_layer_losses(runs) -> str:
    """Mean test loss per state at γ_train, one line per run."""
    lines = []
    for r in runs:
        losses = " ".join(f"{v:.3f}" for v in _at_train(r, "layer_loss"))
        lines.append(
            f"{r['model']}-{r['layers']} {KINDS[r['constrained']]} seed {r['seed']}: {losses}"
        )
    return "\n".join(lines)


def experiment_fingerprint(cfg, model: TextClassifier, data: TextSplits, tokens) -> dict[str, Any]:
    """What a checkpoint depends on: the config (minus output-only fields), the pretrained
    folder and the data it was trained on."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUME_IGNORES}
    return config | {
        "encoder_folder": str(model.encoder.path),
        "data_source": data.source,
        "train_shape": list(tokens["train"].ids.shape),
        "noise_unit": model.noise_unit,
    }


def run_experiment(cfg, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the whole experiment of ``cfg`` (an ``experiments.text_classify.Config``).

    Order matters for safety: the data and the pretrained model are read (and any error raised)
    before the output folder is touched; ``results.json`` is written last, so its presence means
    a complete run.
    """
    t0 = time.perf_counter()
    data = load_text_data(
        cfg.dataset,
        cfg.data_dir,
        download=cfg.download,
        num_train=cfg.num_train,
        num_test=cfg.num_test,
        val_fraction=cfg.val_fraction,
        seed=cfg.seed,
    )
    model = build_text_model(
        cfg.model,
        num_classes=data.num_classes,
        checkpoint=cfg.checkpoint,
        granularity=cfg.granularity,
        layers=cfg.layers,
        train_embeddings=cfg.train_embeddings,
        noise_scale=cfg.noise_scale,
        pooling=cfg.pooling,
        ut_a=cfg.ut_a,
        ut_b=cfg.ut_b,
    )
    if cfg.max_length > model.encoder.config.max_length:
        raise UsageError(
            f"--max-length {cfg.max_length} exceeds the {model.encoder.config.max_length} "
            f"positions of {model.encoder.path}: pass a smaller --max-length"
        )
    tokens = tokenize_splits(model, data, cfg.max_length)
    full = float(np.mean(tokens["train"].lengths >= cfg.max_length))
    print(
        f"data: {data.source}: train {len(data.train)} / val {len(data.val)} / test "
        f"{len(data.test)}, {data.num_classes} classes; {cfg.max_length} tokens "
        f"({100 * full:.0f}% of train texts fill or exceed them); {time.perf_counter() - t0:.1f}s"
    )
    print(
        f"model: {model.name} from {model.encoder.path}: {model.blocks} "
        f"{'UT layers' if model.ut is not None else 'blocks'}, {model.granularity} granularity "
        f"-> {model.num_layers + 1} states; noise std = gamma x {model.noise_unit:.4g}"
        + (" (std of the word-embedding table)" if cfg.noise_scale is None else "")
    )
    out = open_output(
        out_dir or cfg.out or fresh_run_dir("text_classify"),
        experiment_fingerprint(cfg, model, data, tokens),
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
    gammas = test_gamma_grid(cfg.gamma_train, cfg.test_gammas)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    eval_key = jax.random.key(10_000 + cfg.seed)
    evaluate = make_evaluator(model, cfg.max_length, cfg.eval_batch_size)
    runs: list[dict] = []
    ratios: dict[tuple[str, bool], np.ndarray] = {}
    train_seconds, eval_seconds = {}, {}
    for constrained in (False, True):
        kind = f"{model.name}-{KINDS[constrained]}"
        t = time.perf_counter()
        descent, result = _train_group(model, constrained, cfg, tokens["train"], seeds, out)
        train_seconds[kind] = time.perf_counter() - t
        t = time.perf_counter()
        group_runs, group_ratios = _summarise_group(
            model, constrained, cfg, tokens, evaluate, descent, result, seeds, gammas, eval_key
        )
        eval_seconds[kind] = time.perf_counter() - t
        runs += group_runs
        ratios[(f"{model.name}-{model.num_layers}", constrained)] = group_ratios
    select_best(runs, "val_accuracy", higher_is_better=True)
    config = dataclasses.asdict(cfg) | {
        "lr": default_lr(cfg),
        "reference_bound": reference_bound(cfg.reference, model.num_classes),
        "noise_unit": model.noise_unit,
        "encoder_folder": str(model.encoder.path),
        "data_source": data.source,
        "num_classes": data.num_classes,
        "label_names": list(data.label_names),
        "test_gamma": gammas,
        "out": str(out.path),
    }
    results = {
        "experiment": "text_classify",
        "config": config,
        "paper_descent": PAPER_DESCENT,
        "runs": runs,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "wall_seconds": time.perf_counter() - t0,
    }
    gi = gammas.index(float(cfg.gamma_train))
    figures = {
        "layer_loss": out.path / "layer_loss.png",
        "accuracy": out.path / "accuracy_vs_gamma.png",
        "ratios": out.path / "ratio_hist.png",
    }
    plots.plot_layer_losses(
        runs,
        figures["layer_loss"],
        gamma_index=gi,
        title=f"mean test cross-entropy per state at γ_train = {cfg.gamma_train}",
    )
    plots.plot_metric_vs_gamma(
        runs,
        figures["accuracy"],
        key="accuracy",
        ylabel="test accuracy",
        gamma_train=cfg.gamma_train,
        title="test accuracy vs embedding perturbation (γ > γ_train: OOD)",
    )
    plots.plot_ratio_histograms(
        ratios,
        figures["ratios"],
        title=f"per-sample ratios ℓ_l / ℓ_(l-1) on the test set at γ_train = {cfg.gamma_train}",
    )
    write_json_atomic(out.path / "results.json", results)
    print(format_text_table(runs))
    print(f"mean test loss per state at gamma_train = {cfg.gamma_train}:")
    print(format_layer_losses(runs))
    names = ", ".join(str(p) for p in [out.path / "results.json", *figures.values()])
    print(f"wrote {names} in {results['wall_seconds']:.0f}s")
    return results


def load_results(path: str | Path) -> dict:
    with open(path) as f:
        return json.load(f)
