"""Tracing a model into the IR: torch.fx, then torch.export; the probe run, symbolic shapes,
sources and value specs, and the IR build.
"""
