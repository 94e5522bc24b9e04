"""The paper's table jobs: Table 3 (video, :mod:`experiments.paper.video_table`) and Table 4
(text, :mod:`experiments.paper.text_table`), both run through :mod:`experiments.paper.job`, the
grid of sub-runs over the shared runner."""
