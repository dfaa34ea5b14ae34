"""Demo fleet and people, so anyone can try every role at once (refused outside demo mode)."""

from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal.audit import services as audit
from portal.fleet import inventory as fleet_inventory
from portal.security.demo import DEMO_PASSWORD, mark_demo_user
from portal.tenancy import departments, quotas
from portal.tenancy import teams as team_services
from portal.tenancy.models import AffinityLabel, Department, ExclusionGroup, Membership, Preset, Role, Team, TeamPolicy

# slug: (name, parent). Research holds the A100s both teams share: vision's lie under perception,
# which has no quota of its own (it counts as the sum of its teams), nlp's under language.
DEPARTMENTS = {
    "research": ("Research", None),
    "perception": ("Perception", "research"),
    "language": ("Language", "research"),
}
# slug: (name, department)
TEAMS = {
    "vision": ("Computer vision", "perception"),
    "nlp": ("Language models", "language"),
}


def _row(model: str, share: str, gib: int, gpus: int, **extra) -> dict:
    return {"gpu_model": model, "gpu_share": share, "gpu_memory_gib": gib, "gpus": gpus, **extra}


# The demo fleet has 12 A100-80GB, 4 V100-32GB and 2 T4. Quotas hold 6 of the A100s for research,
# 5 of them promised to its teams: one A100 of research's and whatever vision or nlp leave unused
# is lent to the other (borrowed, reclaimable), and the other 6 A100s are idle capacity beyond every
# quota (opportunistic). Children are set before their parents, so every step fits.
QUOTAS = [
    ("team", "vision", [_row("A100-80GB", "3.0", 240, 4, borrowing_limit={"gpu_share": "2.0"}),
                        _row("T4", "1.0", 15, 2, lending_limit={"gpu_share": "0.5"})]),
    ("team", "nlp", [_row("A100-80GB", "1.0", 80, 2), _row("V100-32GB", "2.0", 64, 2)]),
    ("department", "language", [_row("A100-80GB", "2.0", 160, 2), _row("V100-32GB", "2.0", 64, 2)]),
    ("department", "research", [_row("A100-80GB", "6.0", 480, 6), _row("*", "4.0", 96, 6)]),
]
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
    help = ("Create the demo fleet (from a YAML inventory), departments, teams vision and nlp with quotas per GPU "
            "model, and demo users.")

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
        by = audit.cli("seed_demo")
        with transaction.atomic():
            teams = self._tree(by)
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
                    "gpu_memory_mib": memory, "max_duration_s": duration, "image": image, "command": command,
                    # the notebooks open in the browser (portal.connect); the local backend runs Jupyter
                    "app": "jupyter" if name.startswith("Notebook") else ""})
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
        self.stdout.write("departments: research (perception: vision; language: nlp), quotas per GPU model")
        self.stdout.write(f"people (password: {DEMO_PASSWORD}): alice (vision member), bob (nlp member), "
                          "carol (vision admin), dave (manager of both), admin (site admin)")

    def _tree(self, by: audit.Actor) -> dict[str, Team]:
        """Departments, teams in them and their quotas, through the tenancy services (checked and
        audited). Run again, it changes nothing where the demo's tree is already in place."""
        for slug, (name, parent) in DEPARTMENTS.items():
            if not Department.objects.filter(slug=slug).exists():
                departments.create_department(by, slug, name, parent)
        teams = {}
        for slug, (name, _) in TEAMS.items():
            teams[slug] = Team.objects.filter(slug=slug).first() or team_services.create_team(by, slug, name)
        if any(teams[slug].department_id is None or teams[slug].department.slug != department
               for slug, (_, department) in TEAMS.items()):
            # Teams come from elsewhere (a database seeded before departments, where they sit under
            # `default` with their old quotas): clear the demo departments' quotas, move the teams
            # in, and give everyone the demo's quotas below.
            for kind, slug, _ in QUOTAS:
                if kind == "department":
                    quotas.replace_quotas(Department.objects.get(slug=slug), by, [])
            for slug, (_, department) in TEAMS.items():
                quotas.replace_quotas(teams[slug], by, [])
                teams[slug] = departments.move_team(teams[slug], by, department)
        for kind, slug, rows in QUOTAS:
            unit = teams[slug] if kind == "team" else Department.objects.get(slug=slug)
            quotas.replace_quotas(unit, by, rows)
        # The department the migration put those teams under, left empty.
        default = Department.objects.filter(slug="default", teams=None, children=None).first()
        if default is not None:
            departments.delete_department(default, by)
        return teams
