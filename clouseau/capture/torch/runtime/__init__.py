"""What runs on each call: the tier sequence, the instrumented module, the lowering a call
takes, forward hooks, ``generate``, host copies.
"""
