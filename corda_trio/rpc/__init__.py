"""corda_trio.rpc (see DESIGN.md §1)."""

__all__: list[str] = []
