"""Composition root: configuration, the Node nursery tree and the ``corda-trio`` command line."""

from ._cli import main as main

__all__ = ["main"]
