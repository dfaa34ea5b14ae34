"""WebSocket consumers: `agent` (ws/agents/, node agents, token auth) and `browser` (ws/live/,
browsers, session auth)."""

from .agent import AgentConsumer
from .browser import LiveConsumer

__all__ = ["AgentConsumer", "LiveConsumer"]
