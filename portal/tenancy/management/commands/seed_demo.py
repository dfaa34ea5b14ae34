"""Demo fleet and people, so anyone can try every role at once (refused outside demo mode)."""

from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal.fleet import inventory as fleet_inventory
from portal.security.demo import DEMO_PASSWORD, mark_demo_user
from portal.tenancy.models import AffinityLabel, ExclusionGroup, Membership, Preset, Role, Team, TeamPolicy

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
# team, name, kind, model, request, limit, memory (MiB), duration (s), image, command
PRESETS = [
    ("vision", "Notebook: quarter of an A100", "interactive", "A100-80GB", "0.25", "0.50", 16384, 4 * 3600,
     "jupyter/base-notebook:latest", []),
    ("vision", "Training: half an A100", "batch", "A100-80GB", "0.50", "1.00", 40960, 12 * 3600,
     "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", ["python", "train.py"]),
    ("vision", "Inference on a T4", "batch", "T4", "0.50", "0.50", 6144, 3600,
     "nvcr.io/nvidia/tritonserver:24.05-py3", ["tritonserver", "--model-repository=/models"]),
    ("nlp", "Notebook: V100 slice", "interactive", "V100-32GB", "0.25", "0.50", 8192, 4 * 3600,
     "jupyter/base-notebook:latest", []),
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
            AffinityLabel.objects.get_or_create(team=teams["vision"], label="vision-dataloaders",
                                                defaults={"description": "Data loaders share GPUs with each other"})
            # Members may go up to priority 60, admins to 80; idle shares are warned, then reclaimed.
            TeamPolicy.objects.get_or_create(team=teams["vision"], defaults={
                "max_duration_s": 24 * 3600, "max_priority_member": 60, "max_priority_admin": 80})
            TeamPolicy.objects.get_or_create(team=teams["nlp"], defaults={"max_priority_member": 70})
            for slug, name, kind, model, request, limit, memory, duration, image, command in PRESETS:
                Preset.objects.get_or_create(team=teams[slug], name=name, defaults={
                    "kind": kind, "gpu_model": model, "gpu_request": Decimal(request), "gpu_limit": Decimal(limit),
                    "gpu_memory_mib": memory, "max_duration_s": duration, "image": image, "command": command})
            User = get_user_model()
            for username, staff, memberships in PEOPLE:
                user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.com"})
                user.is_staff = user.is_superuser = staff
                user.set_password(DEMO_PASSWORD)
                user.save()
                mark_demo_user(user)  # refused everywhere outside demo mode (portal.security.demo)
                for slug, role in memberships:
                    Membership.objects.update_or_create(user=user, team=teams[slug], defaults={"role": role})
        self.stdout.write(f"fleet: {nodes} nodes, {gpus} GPUs from {inventory}")
        self.stdout.write(f"people (password: {DEMO_PASSWORD}): alice (vision member), bob (nlp member), "
                          "carol (vision admin), dave (manager of both), admin (site admin)")
