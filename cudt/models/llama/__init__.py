"""Llama-family decoders (Llama, Mistral, Qwen2) in pure JAX.

* :mod:`~cudt.models.llama.config`: :class:`DecoderConfig` (architecture, ``config.json``).
* :mod:`~cudt.models.llama.layers`: rotary, RMSNorm, attention, MLP, the scan over blocks.
* :mod:`~cudt.models.llama.model`: :class:`Decoder` (forward, readout, generation entry point).
* :mod:`~cudt.models.llama.generate`: greedy KV-cache generation.
* :mod:`~cudt.models.llama.sharding`: :func:`decoder_partition_specs` (FSDP / tensor parallel).
* :mod:`~cudt.models.llama.hf`: :func:`load_decoder` (a folder or a ``.gguf`` file),
  :func:`write_decoder_folder`.
* :mod:`~cudt.models.llama.gguf`: GGUF files (:func:`load_gguf`, :func:`write_gguf`,
  :func:`smollm2_gguf_path`, :func:`write_tiny_gguf`).
* :mod:`~cudt.models.llama.gguf_tokenizer`: GGUF BPE tokenizers <-> ``tokenizers``.
* :mod:`~cudt.models.llama.chat`: :func:`apply_chat_template`.
* :mod:`~cudt.models.llama.save`: :func:`save_decoder` (a Hugging Face folder or a ``.gguf``
  file, written atomically).
* :mod:`~cudt.models.llama.lora`: LoRA adapters (:class:`LoraSpec`, :func:`init_adapters`,
  :func:`adapted` for the forward, :func:`merged` for export, :func:`save_adapters` in PEFT's
  layout).
"""

from cudt.models.llama.chat import apply_chat_template
from cudt.models.llama.config import SUPPORTED_DECODER_TYPES, DecoderConfig
from cudt.models.llama.gguf import load_gguf, smollm2_gguf_path, write_gguf, write_tiny_gguf
from cudt.models.llama.hf import load_decoder, write_decoder_folder
from cudt.models.llama.lora import LoraSpec, adapted, init_adapters, merged, save_adapters
from cudt.models.llama.model import Decoder
from cudt.models.llama.save import save_decoder
from cudt.models.llama.sharding import ShardingMode, decoder_partition_specs

__all__ = [
    "SUPPORTED_DECODER_TYPES",
    "Decoder",
    "DecoderConfig",
    "LoraSpec",
    "ShardingMode",
    "adapted",
    "apply_chat_template",
    "decoder_partition_specs",
    "init_adapters",
    "load_decoder",
    "load_gguf",
    "merged",
    "save_adapters",
    "save_decoder",
    "smollm2_gguf_path",
    "write_decoder_folder",
    "write_gguf",
    "write_tiny_gguf",
]
