"""corda_trio.testing: public test helpers (DESIGN.md §1): engine pairs without I/O, an in-memory broker."""

from ._broker import QueueBroker as QueueBroker
from ._pair import ConnectionPair as ConnectionPair

__all__ = ["ConnectionPair", "QueueBroker"]
