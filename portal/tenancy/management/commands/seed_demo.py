"""Demo fleet and people, so anyone can try every role at once (refused outside demo mode)."""

from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal.fleet import inventory as fleet_inventory
from portal.tenancy.models import ExclusionGroup, Membership, Role, Team

DEMO_PASSWORD = "tessera-demo"
TEAMS = {
    "vision": ("Computer vision", Decimal("3.0")),
    "nlp": ("Language models", Decimal("2.5")),
}
PEOPLE = [
    # username, staff, [(team, role)]
    ("alice", False, [("vision", Role.MEMBER)]),
    ("bob", False, [("nlp", Role.MEMBER)]),
    ("carol", False, [("vision", Role.ADMIN)]),
    ("dave", False, [("vision", Role.MANAGER), ("nlp", Role.MANAGER)]),
    ("admin", True, []),
]


class Command(BaseCommand):
    help = "Create the demo fleet (from a YAML inventory), teams vision and nlp, and demo users."

    def add_arguments(self, parser):
        parser.add_argument("--inventory", default=settings.TESSERA_INVENTORY, help="inventory YAML file")

    def handle(self, inventory: str, **options):
        if not settings.DEMO_MODE:
            raise CommandError("seed_demo creates users with a well-known password; it runs only with "
                               "DEBUG or TESSERA_DEMO=1")
        try:
            nodes, gpus = fleet_inventory.load(inventory)
        except fleet_inventory.InventoryError as exc:
            raise CommandError(str(exc)) from None
        with transaction.atomic():
            teams = {}
            for slug, (name, quota) in TEAMS.items():
                teams[slug], _ = Team.objects.get_or_create(
                    slug=slug, defaults={"name": name, "quota_gpu_share": quota, "quota_memory_mib": 160 * 1024,
                                         "quota_max_gpus": 6})
            ExclusionGroup.objects.get_or_create(team=teams["vision"], label="vision-secure",
                                                 defaults={"description": "Never shares a GPU with others"})
            User = get_user_model()
            for username, staff, memberships in PEOPLE:
                user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.com"})
                user.is_staff = user.is_superuser = staff
                user.set_password(DEMO_PASSWORD)
                user.save()
                for slug, role in memberships:
                    Membership.objects.update_or_create(user=user, team=teams[slug], defaults={"role": role})
        self.stdout.write(f"fleet: {nodes} nodes, {gpus} GPUs from {inventory}")
        self.stdout.write(f"people (password: {DEMO_PASSWORD}): alice (vision member), bob (nlp member), "
                          "carol (vision admin), dave (manager of both), admin (site admin)")
