"""The team's flat quota columns, moved to its `*` Quota row by 0007. Reversed, they come back with
their old defaults and 0007's reverse fills them from the `*` rows."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0007_team_quotas_to_rows'),
    ]

    operations = [
        migrations.RemoveField(model_name='team', name='quota_gpu_share'),
        migrations.RemoveField(model_name='team', name='quota_memory_mib'),
        migrations.RemoveField(model_name='team', name='quota_max_gpus'),
    ]
