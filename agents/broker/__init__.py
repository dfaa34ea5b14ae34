"""The node's share broker: grants GPU time tokens to the preload library in every workload process.

Run it with ``python -m agents.broker --socket PATH --control-socket PATH`` or embed it with
:func:`serve`. Share terms come only from the node agent on the control socket; a process is tied to
its share by its peer credentials (:mod:`agents.broker.identity`). The wire protocol is documented in
``preload/PROTOCOL.md``.
"""

from agents.broker.policy import BrokerSettings, GpuScheduler
from agents.broker.server import Broker, serve

__all__ = ["Broker", "BrokerSettings", "GpuScheduler", "serve"]
