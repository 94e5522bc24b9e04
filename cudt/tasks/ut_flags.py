"""The UT's flags, declared once for the tasks that train a UT (text and video): each task
gives its own default, where the flags act (its UT) and, where its data needs one, a note of
its own."""

from __future__ import annotations

from cudt.models.ut import TYINGS
from cudt.runner.config import Needs, flag, one_of

# name -> (help, check)
UT_FLAGS = {
    "ut_a": ("UT attention step a", None),
    "ut_b": ("UT feed-forward step b: W_f = -b/2 (W + W^T) + (1-b) I", None),
    "ut_tying": (
        "which UT weights the layers share: all (one layer applied L times, the published "
        "code), attention (the attention matrix only, one feed-forward map and bias per "
        "layer: the paper's Section 4) or none",
        one_of(*TYINGS),
    ),
    "ut_skip": (
        "UT residual connection inside the ReLU, Y <- ReLU(Z + Z W_f + B): the gradient step "
        "of Yang et al.'s energy (the paper's eq. 48); the identity map is then reachable",
        None,
    ),
}


def ut_flag(name: str, default, note: str = "", *, needs: Needs):
    """The config field of ``--ut-…`` (:data:`UT_FLAGS`) with this task's default; ``note``:
    what the task adds about its own data or default; ``needs``: when the task trains a UT
    (set otherwise, the flag is refused: :func:`cudt.runner.config.flag`)."""
    help, check = UT_FLAGS[name]
    return flag(default, f"{help}; {note}" if note else help, check=check, needs=needs)
