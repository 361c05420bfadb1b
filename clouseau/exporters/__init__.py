"""Exporters of the IR: graphviz drawings (``graphviz``) and ONNX models (``onnx``).

Each exporter is imported on use (``clouseau.draw``, ``clouseau.export_onnx``), so that
``import clouseau`` needs neither graphviz nor onnx; they do not import each other.
"""
