"""corda_trio.messaging (see DESIGN.md §1)."""

__all__: list[str] = []
