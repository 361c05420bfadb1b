"""An instrumented IR graph as a ``torch.fx.GraphModule`` that returns the saved values beside
the outputs: saves, interventions, gradient taps, computed points.
"""
