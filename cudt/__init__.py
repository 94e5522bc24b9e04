"""cudt: constrained unrolled transformers in JAX.

Train transformers whose every layer must lower the loss by a factor, with the constraints
enforced by a primal-dual method in one jitted step. See README.md.
"""

from cudt import descent
from cudt.constrained import DescentConfig, constraint_values
from cudt.constrained_step import ConstrainedState, make_constrained_step
from cudt.constraint import Constraint, FreeSign
from cudt.dropin import ConstrainedLoss, init_multipliers, lagrangian
from cudt.dual import (
    as_dual,
    dual_adam,
    dual_ascent,
    nupi,
    project_nonnegative,
    resilience_decay,
)
from cudt.errors import CheckpointError, CudtError, DataError, UsageError
from cudt.formulation import AugmentedLagrangian, Lagrangian, QuadraticPenalty
from cudt.models.encoders import Encoder, EncoderError, load_encoder
from cudt.models.hf import ModelFolderError
from cudt.models.llama import Decoder, DecoderConfig, load_decoder, save_decoder
from cudt.models.vit import ViT, load_vit
from cudt.train import make_train_step, set_learning_rate

__all__ = [
    "AugmentedLagrangian",
    "ConstrainedLoss",
    "ConstrainedState",
    "Constraint",
    "FreeSign",
    "Lagrangian",
    "QuadraticPenalty",
    "init_multipliers",
    "lagrangian",
    "make_constrained_step",
    "nupi",
    "CheckpointError",
    "CudtError",
    "DataError",
    "Decoder",
    "DecoderConfig",
    "DescentConfig",
    "Encoder",
    "EncoderError",
    "ModelFolderError",
    "UsageError",
    "ViT",
    "as_dual",
    "constraint_values",
    "dual_adam",
    "dual_ascent",
    "load_decoder",
    "load_encoder",
    "load_vit",
    "make_train_step",
    "project_nonnegative",
    "resilience_decay",
    "save_decoder",
    "set_learning_rate",
    "descent",
]

__version__ = "0.1.0"
