"""Speed benchmarks: scripts printing ratios of alternatives measured side by side (see README.md)."""
