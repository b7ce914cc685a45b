"""corda_trio.testing (see DESIGN.md §1)."""

__all__: list[str] = []
