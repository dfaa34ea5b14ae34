from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex


class AddIndexWithoutLockingWrites(AddIndexConcurrently):
    """CREATE INDEX CONCURRENTLY on PostgreSQL, where the reservations table keeps taking submits
    while the index builds; a plain index elsewhere (SQLite, the demo), which has no such thing."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("reservations", "0005_allocation_share_terms_names"),
    ]

    operations = [
        AddIndexWithoutLockingWrites(
            model_name="reservation",
            index=models.Index(condition=models.Q(pod_name__gt=""), fields=["state"], name="reservation_with_pod"),
        ),
    ]
