"""corda_trio.transport (see DESIGN.md §1)."""

__all__: list[str] = []
