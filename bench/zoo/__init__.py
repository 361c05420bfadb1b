"""The model zoo: every architecture the installed libraries ship, captured and checked.

:mod:`.catalog` lists the cases (transformers model types by :mod:`.hf`, torchvision
builders and a timm sample by :mod:`.vision`, JAX models by :mod:`.jax_models`);
:mod:`.check_torch` and :mod:`.check_jax` check one against eager; ``__main__`` runs them
one subprocess each and :mod:`.report` writes docs/models.md. ``tests/zoo`` runs a fixed
sample of the same cases through the same checks.
"""
