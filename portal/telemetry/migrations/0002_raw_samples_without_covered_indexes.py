"""Drop the single-column indexes on GpuSample.gpu and ShareSample.reservation: the (gpu, ts) and
(reservation, ts) indexes serve the same lookups, and every index costs work on each of the
thousands of rows written a second. Only the indexes go: the foreign keys stay as they are
(Django's AlterField would drop and re-validate them over the whole raw table)."""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = [
    ("telemetry_gpusample_gpu_id_1de618f3", "telemetry_gpusample", "gpu_id"),
    ("telemetry_sharesample_reservation_id_6348c14c", "telemetry_sharesample", "reservation_id"),
]


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0001_initial'),
        ('reservations', '0002_placement_lifecycle'),
        ('telemetry', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{name}"',
                                  reverse_sql=f'CREATE INDEX "{name}" ON "{table}" ("{column}")')
                for name, table, column in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name='gpusample',
                    name='gpu',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name='+', to='fleet.gpu'),
                ),
                migrations.AlterField(
                    model_name='sharesample',
                    name='reservation',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name='+', to='reservations.reservation'),
                ),
            ],
        ),
    ]
