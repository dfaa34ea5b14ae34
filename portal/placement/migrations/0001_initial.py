from django.db import migrations, models


def create_fence(apps, schema_editor):
    apps.get_model("placement", "Fence").objects.get_or_create(pk=1)


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Fence",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("accepted", models.BigIntegerField(default=0, help_text="Highest token that committed")),
                ("issued", models.BigIntegerField(default=0, help_text="Last token handed out without Redis")),
            ],
        ),
        migrations.RunPython(create_fence, migrations.RunPython.noop),
    ]
