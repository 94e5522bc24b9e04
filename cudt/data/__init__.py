"""Data: synthetic and real surveillance video, split by video, as patch-token sequences
(:mod:`cudt.data.video`), and text classification data: synthetic sentiment, IMDb, MNLI, aclImdb
(:mod:`cudt.data.text`). Their public names (each one's ``__all__``) are this package's too:
``from cudt.data import load_video_data, load_text_data``."""

from cudt.data import text, video

__all__ = sorted({*video.__all__, *text.__all__})

globals().update({name: getattr(text if name in text.__all__ else video, name) for name in __all__})
