"""Tasks of the shared runner (:mod:`cudt.runner`): each says how to load its data, build its
models and layer losses, and score them; nothing else."""
