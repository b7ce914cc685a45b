"""corda_trio.store (see DESIGN.md §1)."""

__all__: list[str] = []
