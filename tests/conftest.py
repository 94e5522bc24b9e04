"""Fixtures shared by several test modules (plain helper functions are in ``helpers.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_tiny_bert


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A random 2-block BERT folder (hidden size 32) with MiniLM's ``tokenizer.json``."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))
