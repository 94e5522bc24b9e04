"""Pretrained Vision Transformer (ViT) in Flax: see :mod:`~cudt.models.vit.model`."""

from cudt.models.vit.model import ViT as ViT
from cudt.models.vit.model import ViTConfig as ViTConfig
from cudt.models.vit.model import ViTPreprocessor as ViTPreprocessor
from cudt.models.vit.model import load_vit as load_vit
from cudt.models.vit.model import write_vit_folder as write_vit_folder

__all__ = ["ViT", "ViTConfig", "ViTPreprocessor", "load_vit", "write_vit_folder"]
