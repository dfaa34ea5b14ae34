from django.db import migrations, models


def causes_from_reasons(apps, schema_editor):
    """Nodes lost before the cause had a field said it at the start of their reason."""
    Node = apps.get_model("fleet", "Node")
    Node.objects.filter(status="lost", status_reason__startswith="no agent report for").update(
        lost_cause="agent_silent")
    Node.objects.filter(status="lost", status_reason__startswith="the cluster reports the node not ready").update(
        lost_cause="cluster_not_ready")


class Migration(migrations.Migration):
    dependencies = [("fleet", "0003_gpu_model_label")]

    operations = [
        migrations.AddField(
            model_name="node",
            name="lost_cause",
            field=models.CharField(blank=True, max_length=24, choices=[
                ("agent_silent", "Its agent stopped reporting"),
                ("cluster_not_ready", "The cluster reports it not ready")]),
        ),
        migrations.RunPython(causes_from_reasons, migrations.RunPython.noop),
    ]
