"""The configuration of a BERT-family encoder, parsed from a Hugging Face ``config.json``.

:class:`EncoderConfig` holds the architecture (hashable: a static ``jax.jit`` argument) of a
BERT, DistilBERT or RoBERTa model; unsupported options raise one :class:`EncoderError` line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cudt.models.hf import (
    EncoderStackConfig,
    bert_sizes,
    check_heads,
    check_sizes,
    malformed_fields,
    parse_activation,
)

# The error every loading problem raises, by its older name, kept for existing callers.
from cudt.models.hf import ModelFolderError as EncoderError

__all__ = ["SUPPORTED_MODEL_TYPES", "EncoderConfig", "EncoderError"]

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("bert", "distilbert", "roberta")


@dataclasses.dataclass(frozen=True)
class EncoderConfig(EncoderStackConfig):
    """Architecture hyper-parameters parsed from a Hugging Face ``config.json``: the sizes of
    :class:`~cudt.models.hf.EncoderStackConfig`, then these.

    Hashable, so it can be a static argument of ``jax.jit``. ``type_vocab_size`` is 0 for
    DistilBERT, which has no token type embeddings.
    """

    model_type: str  # "bert" | "distilbert" | "roberta"
    max_position_embeddings: int
    vocab_size: int
    type_vocab_size: int
    pad_token_id: int

    @property
    def max_length(self) -> int:
        """Longest sequence T the position embedding table can serve.

        RoBERTa numbers positions from ``pad_token_id + 1`` (fairseq legacy), so it loses
        ``pad_token_id + 1`` slots: 514 positions with pad id 1 give T <= 512.
        """
        if self.model_type == "roberta":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> EncoderConfig:
        """Parse a ``config.json`` dict, filling keys it omits with the HF class defaults."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise EncoderError(
                f"unsupported architecture {model_type!r}: supported are "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}; pass a folder of one of those (its "
                "config.json model_type)"
            )
        with malformed_fields():
            if model_type == "distilbert":
                # DistilBERT uses its own key names and hard-codes LayerNorm eps=1e-12.
                act_name = raw.get("activation", "gelu")
                fields = dict(
                    hidden_size=int(raw.get("dim", 768)),
                    num_layers=int(raw.get("n_layers", 6)),
                    num_heads=int(raw.get("n_heads", 12)),
                    intermediate_size=int(raw.get("hidden_dim", 3072)),
                    layer_norm_eps=1e-12,
                    max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
                    vocab_size=int(raw.get("vocab_size", 30522)),
                    type_vocab_size=0,
                    pad_token_id=int(_or_default(raw.get("pad_token_id"), 0)),
                )
            else:
                pos_type = raw.get("position_embedding_type", "absolute")
                if pos_type != "absolute":
                    raise EncoderError(
                        f"position_embedding_type {pos_type!r} is not supported: only 'absolute' "
                        "position embeddings are implemented"
                    )
                if raw.get("is_decoder", False):
                    raise EncoderError(
                        "config has is_decoder=true (causal attention): only bidirectional "
                        "encoders are supported; set is_decoder to false"
                    )
                act_name = raw.get("hidden_act", "gelu")
                default_pad = 1 if model_type == "roberta" else 0
                fields = dict(
                    bert_sizes(raw),
                    max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
                    vocab_size=int(raw.get("vocab_size", 30522)),
                    type_vocab_size=int(raw.get("type_vocab_size", 2)),
                    pad_token_id=int(_or_default(raw.get("pad_token_id"), default_pad)),
                )
        cfg = cls(model_type=model_type, activation=parse_activation(act_name), **fields)
        sizes = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size")
        check_sizes(cfg, (*sizes, "max_position_embeddings"))
        if model_type != "distilbert" and cfg.type_vocab_size < 1:  # its weights would be skipped
            raise EncoderError(
                f"config.json gives type_vocab_size={cfg.type_vocab_size}: a {model_type} "
                "checkpoint has a token type table (at least 1 row); restore the checkpoint's "
                "value"
            )
        if not 0 <= cfg.pad_token_id < cfg.vocab_size:
            raise EncoderError(
                f"pad_token_id {cfg.pad_token_id} is outside the vocabulary [0, {cfg.vocab_size})"
            )
        if cfg.max_length < 1:
            raise EncoderError(
                f"max_position_embeddings {cfg.max_position_embeddings} leaves no position for "
                f"{model_type} with pad_token_id {cfg.pad_token_id}"
            )
        check_heads(cfg.hidden_size, cfg.num_heads)
        return cfg


def _or_default(value: Any, default: Any) -> Any:
    # HF writes explicit nulls (e.g. "pad_token_id": null); treat them as absent.
    return default if value is None else value
