"""The groups page's "Effect now" column says, for each group, what carries it and how many GPUs
could take its requests now (it stayed empty until a Preview button was pressed)."""

from __future__ import annotations

import re
from decimal import Decimal

from django.test import Client

from portal.fleet.models import Gpu
from tests.reservations import running, submitted


def test_each_group_shows_its_effect_now(fleet, teams, people):
    t4 = Gpu.objects.get(node__name="t4-node-1", index=0)
    running(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.5"), gpu_memory_mib=1024,
                      exclusion="secure"), t4)
    submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.5"), gpu_memory_mib=1024, exclusion="secure")
    carol = Client()
    carol.force_login(people["carol"])
    html = carol.get("/team/vision/groups/").content.decode()
    row = re.search(r'<tr data-group="secure">.*?</tr>', html, re.S).group(0)
    effect = re.search(r"<p data-effect-now>(.*?)</p>", row).group(1)
    total = Gpu.objects.filter(healthy=True, cordoned=False).count()
    # Every empty GPU, and the T4 that holds only `secure`, can take a request in it.
    assert effect == f"1 placed share, 1 waiting request; {total} GPUs can take its requests"
