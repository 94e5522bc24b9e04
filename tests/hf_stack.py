"""The test-only reference stack, torch and transformers (the ``test`` extra), for the parity
tests; what several test modules need lives here, as in ``helpers.py`` (kept apart so that the
processes the tests start, which import ``helpers``, do not pay for importing torch).

Importing this module first keeps transformers on local folders (``HF_HUB_OFFLINE``,
``TRANSFORMERS_OFFLINE``): it never reaches for the hub. ``torch`` and ``transformers`` are None
on a developer machine without the stack; ``requires_hf`` then skips a parity test, and each
parity module's ``test_reference_stack_installed_in_ci`` fails, so no run goes green without
really checking parity.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
    import transformers
except ImportError:  # developer machine without the test-only reference stack
    torch = None
    transformers = None

INSTALL_HINT = 'pip install -e ".[test]"'
requires_hf = pytest.mark.skipif(
    torch is None or transformers is None,
    reason=f"torch/transformers not installed ({INSTALL_HINT})",
)
