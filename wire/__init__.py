"""What the portal and the node agents say to each other, imported by both sides (neither owns it):
`agent_portal` is the agent ↔ portal WebSocket protocol (normative text: wire/PROTOCOL.md), `rate` its
message-rate rule, the token bucket both sides keep to."""
