"""benchmarks/ is a folder of the repository, not an installed package: its tests import it
from the repository root, put on ``sys.path`` here, before their modules are imported."""

from __future__ import annotations

import sys

from helpers import ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
