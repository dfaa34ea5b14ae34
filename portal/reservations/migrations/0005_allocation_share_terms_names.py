# An allocation's terms take the names a reservation's have (one name per concept); data is kept.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0004_remote_shares"),
    ]

    operations = [
        migrations.RenameField("allocation", "compute_share", "gpu_request"),
        migrations.RenameField("allocation", "compute_limit", "gpu_limit"),
        migrations.RenameField("allocation", "memory_mib", "gpu_memory_mib"),
    ]
