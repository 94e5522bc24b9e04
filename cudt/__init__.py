"""cudt: constrained unrolled transformers in JAX.

Train transformers whose every layer must lower the loss by a factor, with the constraints
enforced by a primal-dual method in one jitted step. See README.md.
"""

import os as _os

# jaxlib's CPU LAPACK kernels (eigh, eigvalsh, solve: the UT projection and DUST's step size) run
# on SciPy's OpenBLAS, which by default spins one thread per core. Next to XLA's own threads on a
# small or shared machine that turns a 256x256 eigh from ~7 ms into ~1 s (measured on 2 cores
# under load); one BLAS thread is right for the small matrices factorised here. Takes effect if
# set before the first LAPACK call; export OPENBLAS_NUM_THREADS yourself to override.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from cudt.constrained import DescentConfig, constraint_values, lagrangian_terms
from cudt.dual import as_dual, dual_adam, dual_ascent, project_nonnegative, resilience_decay
from cudt.errors import CheckpointError, CudtError, DataError, UsageError
from cudt.models.encoders import Encoder, EncoderError, load_encoder
from cudt.train import TrainState, make_train_step

__all__ = [
    "CheckpointError",
    "CudtError",
    "DataError",
    "DescentConfig",
    "Encoder",
    "EncoderError",
    "TrainState",
    "UsageError",
    "as_dual",
    "constraint_values",
    "dual_adam",
    "dual_ascent",
    "lagrangian_terms",
    "load_encoder",
    "make_train_step",
    "project_nonnegative",
    "resilience_decay",
]

__version__ = "0.1.0"
