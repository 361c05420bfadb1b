"""clouseau's benchmark suite: ``python -m bench`` (``./dev.sh bench``) writes bench/RESULTS.md.

See docs/performance.md for the method, the variants and the targets.
"""
