"""The output pace: bursts go at once, then the average holds to the rate."""

import pytest

from portal.terminal.limits import OutputPace


def test_output_pace_holds_the_average_to_its_rate():
    now = [0.0]
    pace = OutputPace(1000, 500, clock=lambda: now[0])
    assert pace.delay(500) == 0.0  # the burst goes at once
    assert pace.delay(250) == pytest.approx(0.25)  # then 1000 bytes/s
    now[0] += 0.25
    assert pace.delay(100) == pytest.approx(0.1)
    now[0] += 10
    assert pace.delay(400) == 0.0  # refilled, up to the burst only
    assert pace.delay(200) == pytest.approx(0.1)
