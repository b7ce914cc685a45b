"""corda_trio.amqp (see DESIGN.md §1)."""

__all__: list[str] = []
