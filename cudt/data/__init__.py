"""Data: synthetic and real surveillance video, split by video, as patch-token sequences, and
text classification data (synthetic sentiment, IMDb, MNLI, aclImdb).

The names of both subpackages' ``__all__``, each declared once there (:mod:`cudt.data.video`,
:mod:`cudt.data.text`)."""

from cudt.data import text, video
from cudt.data.text import *  # noqa: F403  (the names of its __all__)
from cudt.data.video import *  # noqa: F403  (the names of its __all__)

__all__ = list(dict.fromkeys([*video.__all__, *text.__all__]))
