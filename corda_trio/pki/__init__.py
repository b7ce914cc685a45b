"""corda_trio.pki (see DESIGN.md §1)."""

__all__: list[str] = []
