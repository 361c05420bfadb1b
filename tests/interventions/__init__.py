"""Interventions and gradient capture: the IR passes and both frontends."""
