"""The Tessera node agent: GPU discovery and sampling, and the telemetry stream to the portal.

The share broker (``agents.broker``) lives in this package too but runs as its own process.
"""

__version__ = "0.1.0"
