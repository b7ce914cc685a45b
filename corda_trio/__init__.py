"""corda-trio: a Corda-style peer-to-peer messaging node on Trio."""

__version__ = "0.1.0"
