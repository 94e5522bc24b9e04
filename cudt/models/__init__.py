"""Models: every one is a pure ``apply(params, x) -> (output, states)`` with ``states [L+1, ...]``.

* ``UT``: tied-weight unrolled transformer (Yang et al. 2022), with ``ut_project`` /
  ``ut_project_tree`` (eigenvalue clipping of ``W̃_f`` after each optimizer step).
* ``DUST``: unrolled sparse coding with symmetric attention (De Weerdt et al. 2023); states are
  patch reconstructions.
* ``dct_matrix`` / ``dct2_dictionary``: DCT bases used for initialisation.
* ``load_vit`` / ``ViT``: a pretrained Hugging Face ViT (``states [L+1, B, N+1, D]``) with a
  trainable readout of every state back to pixels (the paper's ViT denoiser).
* ``load_decoder`` / ``Decoder`` / ``DecoderConfig`` (:mod:`cudt.models.llama`): a Llama-family
  causal LM (Llama, Mistral, Qwen2; ``states [L+1, B, T, D]``) from a Hugging Face folder or a
  GGUF file, greedy KV-cache generation with embedding noise, ``write_decoder_folder``,
  ``write_gguf``, ``apply_chat_template``, ``smollm2_gguf_path`` and
  ``decoder_partition_specs`` (FSDP / tensor-parallel specs).
* :mod:`cudt.models.hf`: the one Hugging Face folder loader every pretrained family shares
  (``load_folder``), its helpers, and ``ModelFolderError``. Each family (``encoders/``,
  ``vit/``, ``llama/``) is a package of config, model and weights.
"""

from cudt.models.dct import dct1_dictionary, dct2_dictionary, dct_matrix
from cudt.models.dust import DUST, hold_dictionaries_near, soft_threshold, spectral_norm_sq
from cudt.models.hf import ModelFolderError
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    apply_chat_template,
    decoder_partition_specs,
    load_decoder,
    smollm2_gguf_path,
    write_decoder_folder,
    write_gguf,
)
from cudt.models.ut import UT, UT_PARAM_KEYS, ut_project, ut_project_tree, ut_projection
from cudt.models.vit import ViT, ViTConfig, ViTPreprocessor, load_vit

__all__ = [
    "DUST",
    "UT",
    "UT_PARAM_KEYS",
    "Decoder",
    "DecoderConfig",
    "ModelFolderError",
    "ViT",
    "ViTConfig",
    "ViTPreprocessor",
    "apply_chat_template",
    "dct1_dictionary",
    "dct2_dictionary",
    "dct_matrix",
    "decoder_partition_specs",
    "hold_dictionaries_near",
    "load_decoder",
    "load_vit",
    "smollm2_gguf_path",
    "soft_threshold",
    "spectral_norm_sq",
    "ut_project",
    "ut_project_tree",
    "ut_projection",
    "write_decoder_folder",
    "write_gguf",
]
