"""corda_trio.flows (see DESIGN.md §1)."""

__all__: list[str] = []
