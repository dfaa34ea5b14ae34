"""The node's share broker: grants GPU time tokens to the preload library in every workload process.

Run it with ``python -m agents.broker --socket PATH`` or embed it with :func:`serve`. The wire
protocol is documented in ``preload/PROTOCOL.md``.
"""

from agents.broker.policy import BrokerSettings, GpuScheduler
from agents.broker.server import Broker, serve

__all__ = ["Broker", "BrokerSettings", "GpuScheduler", "serve"]
