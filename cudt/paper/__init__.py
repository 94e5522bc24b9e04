"""The paper's table jobs: Table 3 (video, :mod:`cudt.paper.video_table`) and Table 4 (text,
:mod:`cudt.paper.text_table`), both run through :mod:`cudt.paper.job`, the grid of sub-runs
over the shared runner."""
