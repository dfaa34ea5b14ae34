"""Every team's flat quota (quota_gpu_share, quota_memory_mib, quota_max_gpus) becomes its `*` Quota
row, and every team moves under one department, `default` ("All teams"), whose own `*` row is their
sum: what each team was guaranteed before, it is guaranteed after. Reversed: the columns are filled
from the `*` rows again (0 where a team has none) and the departments and quota rows go.

A database without teams (a new installation) gets no department: a `default` with a quota of 0
would cap every team later put under it at 0."""

from decimal import ROUND_HALF_UP, Decimal

from django.db import migrations

# The conversions as they were when this was written (migrations do not import the app's code).
GIB = Decimal(1024)
MILLI = Decimal("0.001")
# The largest values the columns hold: Quota's Decimal(10,3), Decimal(12,3) and PositiveInteger,
# and Team's old Decimal(8,3). Only values written past the API's own bounds (10^5 GPUs of share,
# 10^12 MiB, 10^6 GPUs) reach them, in sums over many teams: they are capped, not refused.
MAX_SHARE = Decimal("9999999.999")
MAX_GIB = Decimal("999999999.999")
MAX_GPUS = 2**31 - 1
OLD_MAX_SHARE = Decimal("99999.999")
OLD_MAX_MIB = 2**63 - 1


def mib_to_gib(mib: int) -> Decimal:
    # Exact when the MiB value is a multiple of 128 (every 1/8 GiB, e.g. the old default 81920 MiB =
    # 80 GiB); otherwise rounded, half up, to the nearest 0.001 GiB, so off by at most 0.512 MiB
    # (200000 MiB becomes 195.313 GiB, which reads back as 200001 MiB).
    return min(MAX_GIB, (Decimal(int(mib)) / GIB).quantize(MILLI, rounding=ROUND_HALF_UP))


def gib_to_mib(gib: Decimal) -> int:
    return min(OLD_MAX_MIB, int((Decimal(gib) * GIB).to_integral_value(rounding=ROUND_HALF_UP)))


def forward(apps, schema_editor):
    Team = apps.get_model("tenancy", "Team")
    Department = apps.get_model("tenancy", "Department")
    Quota = apps.get_model("tenancy", "Quota")
    teams = list(Team.objects.order_by("pk"))
    if not teams:
        return
    default, _ = Department.objects.get_or_create(slug="default", defaults={"name": "All teams"})
    share, gib, gpus = Decimal(0), Decimal(0), 0
    for team in teams:
        row = {"gpu_share": min(MAX_SHARE, team.quota_gpu_share), "gpu_memory_gib": mib_to_gib(team.quota_memory_mib),
               "gpus": min(MAX_GPUS, team.quota_max_gpus), "weight": Decimal(1),
               "borrow_gpu_share": None, "borrow_gpu_memory_gib": None, "borrow_gpus": None,
               "lend_gpu_share": None, "lend_gpu_memory_gib": None, "lend_gpus": None}
        Quota.objects.update_or_create(team=team, gpu_model="*", defaults=row)
        share, gib, gpus = share + row["gpu_share"], gib + row["gpu_memory_gib"], gpus + row["gpus"]
    Team.objects.filter(pk__in=[t.pk for t in teams]).update(department=default)
    Quota.objects.update_or_create(department=default, gpu_model="*", defaults={
        "gpu_share": min(MAX_SHARE, share), "gpu_memory_gib": min(MAX_GIB, gib), "gpus": min(MAX_GPUS, gpus),
        "weight": Decimal(1)})


def backward(apps, schema_editor):
    Team = apps.get_model("tenancy", "Team")
    Department = apps.get_model("tenancy", "Department")
    Quota = apps.get_model("tenancy", "Quota")
    rows = {q.team_id: q for q in Quota.objects.filter(team__isnull=False, gpu_model="*")}
    for team in Team.objects.order_by("pk"):
        row = rows.get(team.pk)
        team.quota_gpu_share = min(OLD_MAX_SHARE, row.gpu_share) if row else Decimal(0)
        team.quota_memory_mib = gib_to_mib(row.gpu_memory_gib) if row else 0
        team.quota_max_gpus = row.gpus if row else 0
        team.department = None
        team.save(update_fields=["quota_gpu_share", "quota_memory_mib", "quota_max_gpus", "department"])
    Quota.objects.all().delete()
    Department.objects.update(parent=None)  # parent is PROTECT: unlink, then delete them all
    Department.objects.all().delete()


class Migration(migrations.Migration):

    dependencies = [
        ("tenancy", "0006_departments_and_quotas"),
    ]

    operations = [migrations.RunPython(forward, backward)]
