"""corda_trio.testing: public test helpers (DESIGN.md §1): engine pairs without I/O, ..."""

from ._pair import ConnectionPair as ConnectionPair

__all__ = ["ConnectionPair"]
