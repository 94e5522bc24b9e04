"""The configuration of a ViT, parsed from a Hugging Face ``config.json``, and its pixel
preprocessing, parsed from ``preprocessor_config.json``.

:class:`ViTConfig` holds the architecture (hashable: a static ``jax.jit`` argument);
:class:`ViTPreprocessor` the normalisation (HF ``ViTImageProcessor`` defaults). Unsupported
options raise one :class:`~cudt.models.hf.ModelFolderError` line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cudt.models.hf import (
    EncoderStackConfig,
    ModelFolderError,
    bert_sizes,
    check_heads,
    check_sizes,
    malformed_fields,
    parse_activation,
)

__all__ = ["ViTConfig", "ViTPreprocessor"]


def _pair(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ModelFolderError(f"config.json gives {name}={value}: must be an int or [h, w]")
        return int(value[0]), int(value[1])
    return int(value), int(value)


@dataclasses.dataclass(frozen=True)
class ViTConfig(EncoderStackConfig):
    """Architecture hyper-parameters parsed from a Hugging Face ViT ``config.json``: the sizes of
    :class:`~cudt.models.hf.EncoderStackConfig`, then these.

    Hashable, so it can be a static argument of ``jax.jit``.
    """

    image_size: tuple[int, int]  # (H, W) the position embeddings were trained for
    patch_size: tuple[int, int]  # (ph, pw)
    num_channels: int  # C
    qkv_bias: bool

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid ``(H / ph, W / pw)``."""
        return (
            self.image_size[0] // self.patch_size[0],
            self.image_size[1] // self.patch_size[1],
        )

    @property
    def num_patches(self) -> int:
        """N, patch tokens per image (the sequence is N+1 long with [CLS])."""
        return self.grid[0] * self.grid[1]

    @property
    def patch_dim(self) -> int:
        """Pixels per patch, ``C * ph * pw``."""
        return self.num_channels * self.patch_size[0] * self.patch_size[1]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ViTConfig:
        """Parse a ``config.json`` dict, filling keys it omits with the HF ``ViTConfig`` defaults."""
        model_type = raw.get("model_type")
        if model_type != "vit":
            raise ModelFolderError(
                f"unsupported architecture {model_type!r}: load_vit reads 'vit' models only "
                "(config.json model_type); pass a ViT folder"
            )
        act = parse_activation(raw.get("hidden_act", "gelu"))
        with malformed_fields():
            cfg = cls(
                **bert_sizes(raw),
                activation=act,
                image_size=_pair(raw.get("image_size", 224), "image_size"),
                patch_size=_pair(raw.get("patch_size", 16), "patch_size"),
                num_channels=int(raw.get("num_channels", 3)),
                qkv_bias=bool(raw.get("qkv_bias", True)),
            )
        sizes = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "num_channels")
        check_sizes(cfg, sizes)
        if min(cfg.patch_size) < 1 or any(
            s < p or s % p for s, p in zip(cfg.image_size, cfg.patch_size, strict=True)
        ):
            raise ModelFolderError(
                f"image_size {list(cfg.image_size)} is not a positive multiple of patch_size "
                f"{list(cfg.patch_size)}: fix config.json"
            )
        check_heads(cfg.hidden_size, cfg.num_heads)
        head_dim = raw.get("head_dim")
        if head_dim is not None and int(head_dim) != cfg.head_dim:
            raise ModelFolderError(
                f"head_dim {head_dim} != hidden_size / num_attention_heads = {cfg.head_dim}: "
                "not supported"
            )
        return cfg


@dataclasses.dataclass(frozen=True)
class ViTPreprocessor:
    """Pixel normalisation from ``preprocessor_config.json`` (HF ``ViTImageProcessor`` defaults)."""

    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # one per channel
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_normalize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    size: tuple[int, int] | None = None  # (height, width) the processor resizes to, if it says

    @property
    def intensity_scale(self) -> float:
        """Model-input value (before normalisation) of a full-white pixel (intensity 1)."""
        return 255.0 * self.rescale_factor if self.do_rescale else 255.0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], num_channels: int) -> ViTPreprocessor:
        """Parse a ``preprocessor_config.json`` dict for a model with ``num_channels`` channels."""

        def per_channel(name: str, default: float) -> tuple[float, ...]:
            value = raw.get(name, default)
            values = [value] if isinstance(value, int | float) else value
            if not isinstance(values, list | tuple) or len(values) not in (1, num_channels):
                raise ModelFolderError(
                    f"preprocessor_config.json gives {name}={value!r}: expected a number or "
                    f"{num_channels} numbers"
                )
            out = tuple(float(v) for v in values)
            return out * num_channels if len(out) == 1 else out

        with malformed_fields("preprocessor_config.json"):
            size = raw.get("size")
            if isinstance(size, Mapping) and "height" in size and "width" in size:
                size = (int(size["height"]), int(size["width"]))
            elif isinstance(size, int):
                size = (size, size)
            else:  # {"shortest_edge": ...} or absent: the model's image_size decides
                size = None
            pre = cls(
                image_mean=per_channel("image_mean", 0.5),
                image_std=per_channel("image_std", 0.5),
                do_normalize=bool(raw.get("do_normalize", True)),
                do_rescale=bool(raw.get("do_rescale", True)),
                rescale_factor=float(raw.get("rescale_factor", 1 / 255)),
                size=size,
            )
        if pre.do_normalize and min(pre.image_std) <= 0:
            raise ModelFolderError(
                f"preprocessor_config.json image_std {pre.image_std} must be > 0"
            )
        if pre.do_rescale and pre.rescale_factor <= 0:
            raise ModelFolderError(f"rescale_factor {pre.rescale_factor} must be > 0")
        return pre
