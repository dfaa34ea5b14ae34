"""Departments and quotas per GPU model (issue 23). The data moves in 0007, the old team columns go in 0008:
three migrations, so that no schema change shares a transaction with the rows the data migration writes
(PostgreSQL refuses ALTER TABLE on a table with pending trigger events)."""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0005_idle_warning'),
    ]

    operations = [
        migrations.AddField(
            model_name='teampolicy',
            name='reclaim_grace_s',
            field=models.PositiveIntegerField(default=300, help_text='Warned this long before a borrowed reservation is reclaimed.', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(86400)]),
        ),
        migrations.CreateModel(
            name='Department',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('slug', models.SlugField(unique=True)),
                ('name', models.CharField(max_length=120)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('parent', models.ForeignKey(blank=True, help_text='Blank: directly under the organisation.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='children', to='tenancy.department')),
            ],
            options={
                'ordering': ['slug'],
            },
        ),
        migrations.AddField(
            model_name='team',
            name='department',
            field=models.ForeignKey(blank=True, help_text='Blank: directly under the organisation.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='teams', to='tenancy.department'),
        ),
        migrations.CreateModel(
            name='Quota',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('gpu_model', models.CharField(help_text='A GPU model name, or * for any other model.', max_length=100)),
                ('gpu_share', models.DecimalField(decimal_places=3, help_text='Guaranteed compute: whole GPUs count 1.0 each.', max_digits=10)),
                ('gpu_memory_gib', models.DecimalField(decimal_places=3, help_text='Guaranteed GPU memory.', max_digits=12)),
                ('gpus', models.PositiveIntegerField(help_text='GPUs held at once (a share of one GPU counts 1).')),
                ('borrow_gpu_share', models.DecimalField(blank=True, decimal_places=3, max_digits=10, null=True)),
                ('borrow_gpu_memory_gib', models.DecimalField(blank=True, decimal_places=3, max_digits=12, null=True)),
                ('borrow_gpus', models.PositiveIntegerField(blank=True, null=True)),
                ('lend_gpu_share', models.DecimalField(blank=True, decimal_places=3, max_digits=10, null=True)),
                ('lend_gpu_memory_gib', models.DecimalField(blank=True, decimal_places=3, max_digits=12, null=True)),
                ('lend_gpus', models.PositiveIntegerField(blank=True, null=True)),
                ('weight', models.DecimalField(decimal_places=3, default=Decimal('1.000'), help_text="Share of what is left over, relative to the siblings'.", max_digits=8)),
                ('department', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='quotas', to='tenancy.department')),
                ('team', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='quotas', to='tenancy.team')),
            ],
            options={
                'ordering': ['gpu_model'],
                'constraints': [models.UniqueConstraint(fields=('team', 'gpu_model'), name='unique_team_quota_model'), models.UniqueConstraint(fields=('department', 'gpu_model'), name='unique_department_quota_model'), models.CheckConstraint(condition=models.Q(models.Q(('team__isnull', False), ('department__isnull', True)), models.Q(('team__isnull', True), ('department__isnull', False)), _connector='OR'), name='quota_has_one_owner'), models.CheckConstraint(condition=models.Q(('gpu_share__gte', 0), ('gpu_memory_gib__gte', 0), models.Q(('borrow_gpu_share__isnull', True), ('borrow_gpu_share__gte', 0), _connector='OR'), models.Q(('borrow_gpu_memory_gib__isnull', True), ('borrow_gpu_memory_gib__gte', 0), _connector='OR'), models.Q(('lend_gpu_share__isnull', True), ('lend_gpu_share__gte', 0), _connector='OR'), models.Q(('lend_gpu_memory_gib__isnull', True), ('lend_gpu_memory_gib__gte', 0), _connector='OR')), name='quota_amounts_not_negative'), models.CheckConstraint(condition=models.Q(('weight__gt', 0)), name='quota_weight_positive')],
            },
        ),
    ]
