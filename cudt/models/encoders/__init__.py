"""Pretrained BERT-family text encoders (BERT, DistilBERT, RoBERTa) in Flax: see
:mod:`~cudt.models.encoders.model`."""

from cudt.models.encoders.model import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from cudt.models.encoders.model import Encoder as Encoder
from cudt.models.encoders.model import EncoderConfig as EncoderConfig
from cudt.models.encoders.model import EncoderError as EncoderError
from cudt.models.encoders.model import load_encoder as load_encoder
from cudt.models.encoders.model import minilm_path as minilm_path

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "Encoder",
    "EncoderConfig",
    "EncoderError",
    "load_encoder",
    "minilm_path",
]
