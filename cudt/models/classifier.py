"""The text classifier for the perturbed-embedding experiments (the paper's Section 5).

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
  frozen unless ``train_embeddings``, whose rows are then held to their pretrained norms after
  every step (:meth:`TextClassifier.project`): a row that grew would shrink the perturbation,
  whose scale is fixed from the pretrained table;
* a UT (:class:`cudt.models.UT`, Xavier init, projected at init and after each step) over the same frozen
  word embeddings as the pretrained model (as the paper does), without position embeddings:
  attention and the mean are order-free, so it reads a bag of tokens ("not bad … great" and
  "bad … not great" are one input). ``positions=True`` (an option, off by default) adds the
  encoder's pretrained position embeddings, frozen, to the perturbed word embeddings, as the
  encoder's own embedding layer does (``x̃ = E[ids] + γ·σ_E·n + P[t]``: the noise perturbs the
  token embeddings, not the positions; the UT has no embedding LayerNorm, so the order of the
  sum is only rounding). Frozen because the trained word rows hardly move from their
  pretrained directions in a run (docs/results/text.md), and the pretrained rows already
  encode nearness (MiniLM's: cosine 0.85 between neighbours, 0.26 at 8 apart, 0.01 at 128),
  which attention can read as nearness.
  ``head_norm=True`` (an option, off by default: the paper's readout is plain linear) divides
  the pooled state by its RMS before the head. Why: MiniLM's embeddings have std 0.056, so the
  class difference of the UT's mean-pooled state is about 0.002 per coordinate and Adam at
  1e-3 needs many steps before the head's logits move. With one seed it learned sooner at 64
  tokens and ended lower at 256 tokens, so it is not the default (the runs: ``git show
  6e6e9d9``).

With ``granularity="sublayer"`` the attention and the MLP output of every block are each a state
(``2L+1`` states), else only block outputs (``L+1``). :class:`cudt.tasks.text.TextTask` makes it a
task of the shared runner.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import UsageError
from cudt.models import UT, ut_projection
from cudt.models.encoders import Encoder, load_encoder, minilm_path

__all__ = [
    "GRANULARITIES",
    "MODELS",
    "POOLINGS",
    "Batch",
    "TextClassifier",
    "build_text_model",
    "cross_entropy",
    "make_layer_losses",
]

MODELS = ("minilm", "bert", "distilbert", "roberta", "ut")
GRANULARITIES = ("block", "sublayer")
POOLINGS = ("first", "mean")
# The model_type a --checkpoint folder must hold for each --model (ut: any encoder's embeddings).
_MODEL_TYPES = {"minilm": "bert", "bert": "bert", "distilbert": "distilbert", "roberta": "roberta"}


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
    # With train_embeddings, the ids whose rows are trained (sorted; None: all V). A row that no
    # training batch reads gets a zero gradient at every step, and Adam without weight decay
    # leaves it where it is: training only the training split's vocabulary is the same model
    # at a fraction of the optimiser's work (30,522 rows for MiniLM's vocabulary).
    trained_ids: np.ndarray | None = None
    noise_unit: float = 1.0  # noise std at γ = 1 (σ_E by default)
    pooling: str = "first"  # the head's input: "first" token ([CLS] / <s>) or "mean" of tokens
    head_norm: bool = False  # the head reads pooled / rms(pooled): a scale-free readout
    positions: bool = False  # UT: add the encoder's pretrained position embeddings (frozen)

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
                body["word_embeddings"] = self._trained_rows(self.table)
        else:
            body = jax.tree.map(jnp.asarray, self.encoder.params)
            if self.train_embeddings and self.trained_ids is not None:
                rows = {"embedding": self._trained_rows(self.table)}
                body["embeddings"] = dict(body["embeddings"], word_embeddings=rows)
            if not self.train_embeddings:
                body["embeddings"] = {
                    k: v for k, v in body["embeddings"].items() if k != "word_embeddings"
                }
        # Small normal init (BERT's initializer_range): seeds differ in the head, not the body.
        kernel = 0.02 * jax.random.normal(k_head, (self.dim, self.num_classes), jnp.float32)
        head = {"kernel": kernel, "bias": jnp.zeros((self.num_classes,), jnp.float32)}
        return {"body": body, "head": head}

    def _trained_rows(self, table):
        return table if self.trained_ids is None else table[self.trained_ids]

    def word_table(self, params) -> jax.Array:
        """The trained rows of the word-embedding table (``train_embeddings``): every row, or
        those of ``trained_ids`` in their order."""
        if self.ut is not None:
            return params["body"]["word_embeddings"]
        return params["body"]["embeddings"]["word_embeddings"]["embedding"]

    def full_table(self, params, table: jax.Array | None = None) -> jax.Array:
        """The whole table ``[V, D]`` the model reads: the frozen one (``table``, passed to
        compiled programs as an argument; default: the pretrained), with the trained rows in."""
        frozen = self.table if table is None else table
        if not self.train_embeddings:
            return frozen
        if self.trained_ids is None:
            return self.word_table(params)
        return frozen.at[self.trained_ids].set(self.word_table(params))

    def embed(self, params, ids: jax.Array, table: jax.Array | None = None) -> jax.Array:
        """The word embeddings ``[..., D]`` of ``ids``: a gather from the trained rows where an
        id has one, from the frozen table elsewhere (no ``[V, D]`` array is built or
        differentiated)."""
        if not self.train_embeddings or self.trained_ids is None:
            return self.full_table(params, table)[ids]
        frozen = self.table if table is None else table
        slot = np.full(frozen.shape[0], len(self.trained_ids), np.int32)
        slot[self.trained_ids] = np.arange(len(self.trained_ids), dtype=np.int32)
        row = jnp.asarray(slot)[ids]
        trained = self.word_table(params)
        hit = row < len(self.trained_ids)
        picked = trained[jnp.where(hit, row, 0)]
        return jnp.where(hit[..., None], picked, frozen[ids])

    def noise(self, key: jax.Array, batch: Batch, gamma) -> jax.Array:
        """Perturbation of the input token embeddings: ``γ·noise_unit·n`` on real tokens,
        ``[B, T, D]`` (padding is masked out of attention and pooling anyway)."""
        n = jax.random.normal(key, batch["ids"].shape + (self.dim,), jnp.float32)
        return n * (gamma * self.noise_unit) * batch["mask"][..., None]

    def frozen(self) -> jax.Array | None:
        """What stays frozen during training (the word table, whose untrained rows the model
        reads), or None when every row is trained."""
        if self.train_embeddings and self.trained_ids is None:
            return None
        return self.table

    def states(self, params, batch: Batch, noise: jax.Array, table=None) -> jax.Array:
        """Every state ``[S, B, T, D]`` (S = L+1, or 2L+1 with sub-layers) for noisy inputs."""
        if self.ut is not None:
            x = self.embed(params, batch["ids"], table) + noise  # [B, T, D]
            if self.positions:  # after the noise, as the encoder's embedding layer adds them
                x = x + self.encoder.position_embeddings(batch["ids"])
            _, states = self.ut.apply({"params": params["body"]["ut"]}, x, batch["mask"])
            return states
        body = params["body"]
        if not self.train_embeddings or self.trained_ids is not None:
            whole = {"embedding": self.full_table(params, table)}
            body = dict(body, embeddings=dict(body["embeddings"], word_embeddings=whole))
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
        pooled = pooled.astype(jnp.float32)
        if self.head_norm:
            rms = jnp.sqrt(jnp.mean(jnp.square(pooled), axis=-1, keepdims=True) + 1e-12)
            pooled = pooled / rms
        return pooled @ h["kernel"] + h["bias"]

    def logits(self, params, batch: Batch, noise: jax.Array, table=None) -> jax.Array:
        """Logits of every state ``[S, B, C]``."""
        states = self.states(params, batch, noise, table)
        return self.head(params, self.pool(states, batch["mask"]))

    def with_word_table(self, params, table: jax.Array):
        """``params`` with the trained word table replaced by ``table`` (``train_embeddings``)."""
        body = dict(params["body"])
        if self.ut is not None:
            body["word_embeddings"] = table
        else:
            embeddings = dict(body["embeddings"], word_embeddings={"embedding": table})
            body["embeddings"] = embeddings
        return dict(params, body=body)

    def project(self):
        """The parameter projection after each optimizer step, or None: the UT's
        (:func:`cudt.models.ut_projection`) and, with ``train_embeddings``, every row of the
        trained word table scaled back to at most its pretrained norm. The noise's scale is
        fixed from the pretrained table, so a row that grew would shrink its token's
        perturbation, a robustness the model bought by rescaling instead of learning; a row
        within its norm (to a relative 1e-5) is left bit-exact."""
        ut = None if self.ut is None else ut_projection(self.ut)
        if not self.train_embeddings:
            return ut
        table = self._trained_rows(np.asarray(self.table))
        limit = jnp.asarray(np.linalg.norm(table, axis=-1, keepdims=True))

        def project(params):
            if ut is not None:
                params = ut(params)
            table = self.word_table(params)
            norms = jnp.sqrt(jnp.sum(jnp.square(table), axis=-1, keepdims=True))
            # a row at its own norm, recomputed in another rounding order, is left alone
            scale = jnp.where(norms > limit * (1 + 1e-5), limit / jnp.maximum(norms, 1e-30), 1.0)
            return self.with_word_table(params, table * scale)

        return project


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample cross-entropy ``[S, B]`` of logits ``[S, B, C]`` and labels ``[B]``."""
    picked = jnp.take_along_axis(logits, labels[None, :, None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


def make_layer_losses(model: TextClassifier, gamma=None):
    """``(params, batch, key) -> [B, L+1]``: per-sample cross-entropy of every state at γ.

    ``batch`` is a dict of examples (then ``gamma`` is required), or a
    :class:`cudt.runner.RunBatch` carrying the examples, the run's γ and the frozen table.
    """

    def layer_losses(params, batch, key: jax.Array) -> jax.Array:
        if isinstance(batch, dict):
            examples, g, table = batch, gamma, None
        else:
            examples, g, table = batch.examples, batch.gamma, batch.frozen
        logits = model.logits(params, examples, model.noise(key, examples, g), table)
        return cross_entropy(logits, examples["labels"]).T

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
    head_norm: bool = False,
    ut_tying: str = "all",
    ut_skip: bool = False,
    positions: bool = False,
) -> TextClassifier:
    """Loads the pretrained encoder of ``name`` and wraps it (or a UT over its embeddings).

    ``minilm`` and ``ut`` default to the pip package all-MiniLM-L6-v2; ``bert``, ``distilbert``
    and ``roberta`` need ``checkpoint``, a Hugging Face folder of that architecture.
    ``pooling`` defaults to the paper's, first token for pretrained encoders and mean for the
    UT, except for ``minilm``: mean, the pooling all-MiniLM-L6-v2 was trained with.
    ``positions`` (``ut`` only): the UT reads the encoder's pretrained position embeddings too.
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
            tying=ut_tying,
            skip=ut_skip,
        )
    elif positions:
        raise UsageError(
            f"positions apply to --model ut only: {name} adds its own position embeddings; "
            "drop --ut-positions"
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
        head_norm=head_norm,
        positions=positions,
    )
