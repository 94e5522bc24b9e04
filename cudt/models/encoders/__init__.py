"""Pretrained BERT-family text encoders (BERT, DistilBERT, RoBERTa) in Flax.

Loads a Hugging Face model folder (``config.json``, ``model.safetensors``, ``tokenizer.json``)
with no torch/transformers at run time and returns EVERY layer's hidden state, matching the
``hidden_states`` tuple of the Hugging Face reference (``output_hidden_states=True``, eval mode)::

    enc = load_encoder("path/to/folder")
    ids, mask = enc.tokenize(["a sentence", "another one"], max_length=32)  # [B, T] int32
    states = enc(ids, mask)                                                 # [L+1, B, T, D]

``states[0]`` is the embedding output (after the embedding LayerNorm), ``states[i]`` the output
of block ``i``. For training, use the pure ``enc.apply(params, ids, mask)`` with ``enc.params``
(a nested dict pytree; every leaf under ``params["blocks"]`` has a leading ``[L]`` axis because
the blocks run as one ``jax.lax.scan``, so a single block is compiled whatever the depth).

Only safetensors checkpoints are read: pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ...)
can execute arbitrary code when loaded, so they are refused, never opened.

* :mod:`~cudt.models.encoders.config`: :class:`EncoderConfig` (architecture, ``config.json``).
* :mod:`~cudt.models.encoders.model`: the flax modules and :class:`Encoder`.
* :mod:`~cudt.models.encoders.weights`: the Hugging Face tensor names, :func:`load_encoder`,
  :func:`minilm_path`.
"""

from cudt.models.encoders.config import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from cudt.models.encoders.config import EncoderConfig as EncoderConfig
from cudt.models.encoders.config import EncoderError as EncoderError
from cudt.models.encoders.model import Encoder as Encoder
from cudt.models.encoders.weights import load_encoder as load_encoder
from cudt.models.encoders.weights import minilm_path as minilm_path

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "Encoder",
    "EncoderConfig",
    "EncoderError",
    "load_encoder",
    "minilm_path",
]
