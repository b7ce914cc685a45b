"""corda_trio.bridge (see DESIGN.md §1)."""

__all__: list[str] = []
