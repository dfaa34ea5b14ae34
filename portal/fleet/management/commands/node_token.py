from django.core.management.base import BaseCommand, CommandError

from portal.audit import services as audit
from portal.fleet import services
from portal.fleet.models import Node


class Command(BaseCommand):
    help = "Issue a new agent token for a node (shown once; the old token stops working)."

    def add_arguments(self, parser):
        parser.add_argument("node", help="node name")
        parser.add_argument("--create", action="store_true", help="create the node if it does not exist")
        parser.add_argument("--revoke", action="store_true", help="revoke the node's token instead")

    def handle(self, node: str, create: bool, revoke: bool, **options):
        row = Node.objects.filter(name=node).first()
        if row is None:
            if not create:
                raise CommandError(f"no node named {node!r} (use --create to add it)")
            row = Node.objects.create(name=node)
        if revoke:
            services.revoke_node_token(row, audit.cli())
            self.stdout.write(f"token of node {node} revoked")
            return
        self.stdout.write(services.issue_node_token(row, audit.cli()))
