"""The dynamic tier: TorchDynamo regions between graph breaks, and the ``torch.compile``
backend.
"""
