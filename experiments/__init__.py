"""Thin entry points: ``python -m experiments.<name> --help``."""
