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
    "CheckpointError",
    "ConstrainedState",
    "Constraint",
    "CudtError",
    "DataError",
    "Decoder",
    "DecoderConfig",
    "DescentConfig",
    "Encoder",
    "EncoderError",
    "FreeSign",
    "Implicit",
    "Lagrangian",
    "ModelFolderError",
    "QuadraticPenalty",
    "Schedule",
    "UsageError",
    "ViT",
    "as_dual",
    "constrained",
    "constraint_values",
    "descent",
    "dual_adam",
    "dual_ascent",
    "implicit",
    "implicit_mlp",
    "init_multipliers",
    "lagrangian",
    "load_decoder",
    "load_encoder",
    "load_vit",
    "make_constrained_step",
    "make_train_step",
    "nupi",
    "project_nonnegative",
    "resilience_decay",
    "save_decoder",
    "schedule",
]

__version__ = "0.1.0"
