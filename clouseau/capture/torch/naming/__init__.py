"""Every point name of the torch frontend: ``points`` (the names of a trace, op names, the one
element rule) and ``stack`` (a Dynamo region's names).
"""
