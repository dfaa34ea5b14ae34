"""The quickstart runs on SQLite with tasks in process: notifications are stored once there too."""

from __future__ import annotations


def test_notifications_on_sqlite(on_sqlite, monkeypatch):
    monkeypatch.setenv("EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")  # not into var/mail/
    lines = on_sqlite("""
        from decimal import Decimal
        from django.contrib.auth import get_user_model
        from django.db import transaction
        from portal.fleet import inventory
        from portal.fleet.models import Gpu
        from portal.notifications.models import Notification
        from portal.reservations import rules, services
        from tests.teams import make_team
        from portal.tenancy.models import Membership
        inventory.load(os.environ["INVENTORY"])
        team = make_team("t", "T", quota_gpu_share=Decimal(10), quota_memory_mib=10**7, quota_max_gpus=10)
        user = get_user_model().objects.create_user("u", email="u@example.com")
        Membership.objects.create(user=user, team=team)
        g = Gpu.objects.order_by("pk").first()
        with transaction.atomic():  # the cycle it asks for, after the commit, finds nothing to place
            r = services.submit(user, rules.ReservationSpec(team=team, image="busybox:1.36", name="sq",
                                                            gpu_request=Decimal("0.5"), gpu_memory_mib=1024))
            services.place(r.pk, g.node_id, [services.NewAllocation(g.pk, Decimal("0.5"), 1024)])
        services.move(r.pk, "placed", "running", "its pod runs", "test")
        services.move(r.pk, "running", "running", "again", "test")  # nothing moves: nothing new
        services.release(r.pk, "succeeded", "done", "test")
        for n in Notification.objects.order_by("pk"):
            print(n.event, n.email, n.text)
    """)
    assert lines == [
        "running sent Your reservation 'sq' (0.5 of an A100-80GB) is running on a100-node-1.",
        "finished sent Your reservation 'sq' (0.5 of an A100-80GB) finished successfully.",
    ]
