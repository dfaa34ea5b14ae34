"""The sampling loop's clock: one sample an interval on a fixed grid, and a prompt stop."""

from __future__ import annotations

import asyncio
import time

import pytest

from agents.agent import next_tick
from agents.gpus.simulated import SimulatedSource

from .conftest import make_agent


class StallingSource(SimulatedSource):
    """The simulated GPUs, noting when each read starts; read number `stall_on` takes `stall_s`."""

    def __init__(self, wrapped: SimulatedSource, stall_on: int, stall_s: float, kind: str = "simulated") -> None:
        super().__init__(wrapped.node, wrapped.placements, seed=1)
        self.kind = kind  # "nvml" reads in a worker thread, off the event loop
        self.stall_on = stall_on
        self.stall_s = stall_s
        self.started: list[float] = []

    def read(self):
        self.started.append(time.monotonic())  # the clock of asyncio's loop.time()
        if len(self.started) == self.stall_on:
            time.sleep(self.stall_s)
        return super().read()


def stalling_agent(url: str, interval_s: float, stall_on: int, stall_s: float, kind: str = "simulated"):
    agent = make_agent(url, interval_s=interval_s)
    source = StallingSource(agent.source, stall_on, stall_s, kind)
    agent.source = agent.sampler.source = source
    return agent, source


@pytest.mark.asyncio
async def test_sampling_stays_on_its_interval_grid_after_a_stall_instead_of_catching_up(portal):
    interval = 0.2
    # Read 3 stalls for 2.5 intervals: the missed ticks are skipped, not made up in a burst.
    agent, source = stalling_agent(portal.url, interval, stall_on=3, stall_s=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await portal.wait_for(lambda: len(source.started) >= 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    stalled_until = source.started[2] + 0.5
    after = [t for t in source.started if t > stalled_until]
    # No burst: at most one read per interval after the stall (a busy machine only makes them later).
    assert len(after) >= 6
    assert len(after) <= (after[-1] - stalled_until) / interval + 2, (after, stalled_until)


@pytest.mark.parametrize(("due", "now", "expected"), [
    (1.0, 0.5, 1.0),  # on time: the tick as due
    (1.0, 1.0, 1.0),
    (0.6, 1.05, 1.2),  # a read stalled past two ticks: the next grid point, not 0.8 and 1.0 at once
    (0.6, 0.61, 0.8),
])
def test_a_late_tick_moves_to_the_next_point_of_its_grid(due, now, expected):
    assert next_tick(due, now, 0.2) == pytest.approx(expected)


@pytest.mark.asyncio
async def test_sampling_stops_promptly_when_stopped_between_two_samples(portal):
    agent, source = stalling_agent(portal.url, interval_s=30.0, stall_on=0, stall_s=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await portal.wait_for(lambda: portal.last_seq >= 1)
    stop.set()
    await asyncio.wait_for(task, 10)  # well before the 30 s to the next tick
    assert len(source.started) == 1


@pytest.mark.asyncio
async def test_sampling_stops_promptly_when_stopped_during_a_read_off_the_event_loop(portal):
    agent, source = stalling_agent(portal.url, interval_s=30.0, stall_on=1, stall_s=0.5, kind="nvml")
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await portal.wait_for(lambda: portal.hellos and source.started)
    stop.set()  # while the first read is still running in its thread
    await asyncio.wait_for(task, 10)  # well before the 30 s to the next tick
    assert len(source.started) == 1
