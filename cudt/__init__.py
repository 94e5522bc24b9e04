"""cudt: constrained unrolled transformers in JAX.

Train transformers whose every layer must lower the loss by a factor, with the constraints
enforced by a primal-dual method in one jitted step. See README.md.
"""

from cudt import (
    constrained,
    descent,
)
from cudt.constrained import (
    AugmentedLagrangian,
    ConstrainedState,
    Constraint,
    FreeSign,
    Implicit,
    Lagrangian,
    QuadraticPenalty,
    Schedule,
    as_dual,
    dual_adam,
    dual_ascent,
    implicit,
    implicit_mlp,
    init_multipliers,
    lagrangian,
    make_constrained_step,
    nupi,
    project_nonnegative,
    resilience_decay,
    schedule,
)
from cudt.descent import (
    DescentConfig,
    constraint_values,
    make_train_step,
)
from cudt.errors import (
    CheckpointError,
    CudtError,
    DataError,
    UsageError,
)
from cudt.models.encoders import (
    Encoder,
    EncoderError,
    load_encoder,
)
from cudt.models.hf import ModelFolderError
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    load_decoder,
    save_decoder,
)
from cudt.models.vit import (
    ViT,
    load_vit,
)

__all__ = [
    "AugmentedLagrangian",
    "ConstrainedState",
    "Constraint",
    "FreeSign",
    "Implicit",
    "Lagrangian",
    "QuadraticPenalty",
    "implicit",
    "implicit_mlp",
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
    "constrained",
    "Schedule",
    "schedule",
    "descent",
]

__version__ = "0.1.0"
