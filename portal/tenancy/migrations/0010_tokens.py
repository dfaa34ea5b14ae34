"""One live API token per user and name. Token sign-ins used to mint another "cli" token each
time, so live duplicates exist: all but the newest of each name are renamed "<name> (2)", "(3)"…
(oldest last), never revoked, so no script loses its key."""

from django.db import migrations, models


def rename_duplicates(apps, schema_editor):
    ApiToken = apps.get_model("tenancy", "ApiToken")
    seen: dict[tuple[int, str], int] = {}
    for token in ApiToken.objects.filter(revoked_at__isnull=True).order_by("-created_at", "-id"):
        key = (token.user_id, token.name)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            suffix = f" ({seen[key]})"
            token.name = token.name[: 80 - len(suffix)] + suffix
            token.save(update_fields=["name"])


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0009_connect'),
    ]

    operations = [
        migrations.RunPython(rename_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='apitoken',
            constraint=models.UniqueConstraint(condition=models.Q(('revoked_at__isnull', True)),
                                               fields=('user', 'name'), name='one_live_token_per_name'),
        ),
    ]
