"""An agent process stops once, quietly, however many stop signals reach it (Ctrl-C to the process
group and then the supervisor's SIGTERM is the usual pair)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The second and third signals come while the agent stops: they must stay pending (blocked) until
# the process ends, so no moment of asyncio's loop.close() (which closes the loop's wakeup pipe
# before it removes its signal handlers: what the demo's stop hit by chance) can receive them.
SCRIPT = textwrap.dedent("""
    import asyncio, os, signal
    from agents.signals import stop_on_signals

    HELD = {signal.SIGTERM, signal.SIGINT}

    async def main():
        stop = asyncio.Event()
        stop_on_signals(asyncio.get_running_loop(), stop.set)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop.wait(), 10)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's, while stopping
        os.kill(os.getpid(), signal.SIGINT)  # a repeat changes nothing
        await asyncio.sleep(0)
        assert HELD <= signal.sigpending(), signal.sigpending()

    asyncio.run(main())
    assert HELD <= signal.sigpending(), signal.sigpending()  # through the loop's close, still held
    print("stopped cleanly", flush=True)
""")


def test_a_second_signal_while_the_loop_closes_is_held_back():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped cleanly"
    assert done.stderr == ""
