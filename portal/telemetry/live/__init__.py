"""Live fan-out to browsers, in four parts: `groups` (names, who may join which), `messages`
(what a commit of readings sends to each group), `watching` (which groups anyone watches, and
their sequence numbers) and `publishing` (sending after each commit, spaced, in its own task).
The browser's end is `portal.telemetry.consumers.browser`."""

from .groups import GROUP_PATTERN, Group, may_see, parse_group
from .messages import Latest, messages_for
from .publishing import Fanout, Publisher
from .watching import WATCH_TTL_S, store

__all__ = ["GROUP_PATTERN", "WATCH_TTL_S", "Fanout", "Group", "Latest", "Publisher", "may_see", "messages_for",
           "parse_group", "store"]
