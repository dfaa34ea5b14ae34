"""An agent process stops once, quietly, however many stop signals reach it (Ctrl-C to the process
group and then the supervisor's SIGTERM is the usual pair)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The second signal is sent at the worst moment: inside loop.close(), after asyncio closed the
# loop's wakeup pipe and before it removed its signal handlers (what the demo's stop hit by chance).
SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys
    from asyncio import selector_events
    from agents.signals import stop_on_signals

    close_pipe = selector_events.BaseSelectorEventLoop._close_self_pipe

    def close_then_signal(self):
        close_pipe(self)
        os.kill(os.getpid(), signal.SIGTERM)

    selector_events.BaseSelectorEventLoop._close_self_pipe = close_then_signal

    async def main():
        stop = asyncio.Event()
        stop_on_signals(asyncio.get_running_loop(), stop.set)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop.wait(), 10)
        os.kill(os.getpid(), signal.SIGINT)  # a repeat while stopping changes nothing
        await asyncio.sleep(0.1)

    asyncio.run(main())
    print("stopped cleanly", flush=True)
""")


def test_a_second_signal_while_the_loop_closes_is_held_back():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped cleanly"
    assert done.stderr == ""
