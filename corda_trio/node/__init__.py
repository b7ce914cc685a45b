"""Composition root: configuration, the Node nursery tree and the ``corda-trio`` command line."""

from ._cli import main as main
from ._heap import freeze_startup_heap as freeze_startup_heap

__all__ = ["freeze_startup_heap", "main"]
