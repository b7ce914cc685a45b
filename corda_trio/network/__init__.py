"""corda_trio.network (see DESIGN.md §1)."""

__all__: list[str] = []
