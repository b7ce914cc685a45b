"""The node's side of the flow framework: starts the flow manager and serves the flow RPC calls.

Until ``corda_trio.flows`` provides its manager, the node runs without flows (``start_flow_host``
returns ``None``) and the flow RPC methods answer ``unavailable``.
"""

from __future__ import annotations

from typing import Any

import trio

from corda_trio import messaging

__all__ = ["start_flow_host"]


async def start_flow_host(node: Any, nursery: trio.Nursery, service: messaging.MessagingService) -> Any:
    await trio.lowlevel.checkpoint()
    return None
