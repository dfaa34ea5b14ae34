"""`python -m portal.serve [daphne's options] portal.asgi:application`: Daphne with a size limit
on WebSocket frames and messages, enforced by its WebSocket layer (autobahn) as a frame's header
arrives, before the payload is buffered. Daphne itself offers no such option, and a consumer only
sees a message once it is whole in memory: a client could make the server hold 128 MiB per frame.

The limit is TESSERA_WS_MAX_MESSAGE_BYTES (default: the wire protocol's 1 MiB, the largest message
an agent may send; browsers send a few hundred bytes). Over it the connection is closed with 1009.
"""

from __future__ import annotations

import os

import daphne.server
from daphne.cli import CommandLineInterface
from daphne.ws_protocol import WebSocketFactory

from wire.agent_portal import MAX_MESSAGE_BYTES


def max_message_bytes() -> int:
    return int(os.environ.get("TESSERA_WS_MAX_MESSAGE_BYTES", str(MAX_MESSAGE_BYTES)))


class BoundedWebSocketFactory(WebSocketFactory):
    def setProtocolOptions(self, **options) -> None:  # autobahn's name
        limit = max_message_bytes()
        options.setdefault("maxFramePayloadSize", limit)
        options.setdefault("maxMessagePayloadSize", limit)
        super().setProtocolOptions(**options)


def main() -> None:
    # Daphne builds its factory from this module-level name in Server.run.
    daphne.server.WebSocketFactory = BoundedWebSocketFactory
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
