"""Pretrained Vision Transformer (ViT) in Flax, read back as a per-layer image denoiser.

Loads a Hugging Face ViT folder (``config.json`` with ``model_type "vit"``, ``model.safetensors``,
optionally ``preprocessor_config.json``) with no torch/transformers at run time and returns EVERY
layer's hidden state, matching the ``hidden_states`` tuple of ``transformers.ViTModel``
(``output_hidden_states=True``, eval mode)::

    vit = load_vit("path/to/folder")
    pixel_values = vit.preprocess(frames)          # [B, H, W] gray uint8 / [0,1] -> [B, 3, H', W']
    states = vit(pixel_values)                     # [L+1, B, N+1, D], N = (H'/p)(W'/p) patches
    readout = vit.init_readout(jax.random.key(0))  # trainable D -> p*p*C linear map
    frames_hat = vit.readout(readout, states)      # [L+1, B, C, H', W'] (normalised pixels)
    gray_hat = vit.postprocess(frames_hat[-1])     # [B, H', W'] in [0, 1]

Only safetensors checkpoints are read: pickle checkpoints (``pytorch_model.bin``, ...) are
refused, never opened. Loading problems raise :class:`cudt.models.hf.ModelFolderError`.

* :mod:`~cudt.models.vit.config`: :class:`ViTConfig` (architecture, ``config.json``) and
  :class:`ViTPreprocessor` (``preprocessor_config.json``).
* :mod:`~cudt.models.vit.model`: patch layout, the flax modules and :class:`ViT` (forward,
  readout, pixels); which states it returns.
* :mod:`~cudt.models.vit.weights`: the Hugging Face tensor names, :func:`load_vit`,
  :func:`write_vit_folder`.
"""

from cudt.models.vit.config import ViTConfig as ViTConfig
from cudt.models.vit.config import ViTPreprocessor as ViTPreprocessor
from cudt.models.vit.model import ViT as ViT
from cudt.models.vit.weights import load_vit as load_vit
from cudt.models.vit.weights import write_vit_folder as write_vit_folder

__all__ = ["ViT", "ViTConfig", "ViTPreprocessor", "load_vit", "write_vit_folder"]
