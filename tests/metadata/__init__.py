"""Node metadata: FLOPs, parameter counts, tables and the summary."""
