"""Put on PYTHONPATH by bench/telemetry/live_cpu.py for the live process of either tree: counts the
cyclic collector's passes and the CPU they take, per generation, and writes the totals as JSON to
the file $TESSERA_GC_PROBE every half second (the benchmark reads them at both ends of a round)."""

import gc
import json
import os
import threading
import time

_PATH = os.environ.get("TESSERA_GC_PROBE")

if _PATH:
    _totals = {"passes": [0, 0, 0], "cpu_s": [0.0, 0.0, 0.0]}
    _started = [0.0]

    def _count(phase: str, info: dict) -> None:
        # A pass runs in the thread that allocated; the GIL keeps two from overlapping.
        if phase == "start":
            _started[0] = time.thread_time()
        else:
            _totals["passes"][info["generation"]] += 1
            _totals["cpu_s"][info["generation"]] += time.thread_time() - _started[0]

    def _write() -> None:
        while True:
            time.sleep(0.5)
            with open(_PATH + ".tmp", "w") as f:
                json.dump(_totals, f)
            os.replace(_PATH + ".tmp", _PATH)

    gc.callbacks.append(_count)
    threading.Thread(target=_write, name="gc-probe", daemon=True).start()
