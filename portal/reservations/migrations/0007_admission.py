"""A reservation's `opportunistic` flag becomes `admission` (guaranteed, borrowed, opportunistic),
and a borrowed one being reclaimed says when (`reclaim_at`)."""

from django.db import migrations, models


def forward(apps, schema_editor):
    Reservation = apps.get_model("reservations", "Reservation")
    Reservation.objects.filter(opportunistic=True).update(admission="opportunistic")


def backward(apps, schema_editor):
    Reservation = apps.get_model("reservations", "Reservation")
    Reservation.objects.filter(admission="opportunistic").update(opportunistic=True)


class Migration(migrations.Migration):
    dependencies = [("reservations", "0006_reservation_with_pod")]

    operations = [
        migrations.AddField(
            model_name="reservation", name="admission",
            field=models.CharField(choices=[("guaranteed", "Guaranteed (within the team's quota)"),
                                            ("borrowed", "Borrowed (beyond the quota; may be reclaimed)"),
                                            ("opportunistic", "Opportunistic (idle capacity; preemptible)")],
                                   default="guaranteed", max_length=16),
        ),
        migrations.AddField(model_name="reservation", name="reclaim_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.RunPython(forward, backward),
        migrations.RemoveField(model_name="reservation", name="opportunistic"),
    ]
