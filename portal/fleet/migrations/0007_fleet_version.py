"""A version number of the fleet as placement reads it, kept by PostgreSQL itself.

portal.placement.fleet_cache keeps the nodes and GPUs per process while they are unchanged. It
used to tell with a hash over every node and GPU row (4,500 rows hashed for each capacity preview
and each cycle: PostgreSQL CPU on the portal's cores). These statement triggers bump one counter in
the same transaction as any insert, delete or truncate of the rows, or any update that sets one of
the columns the snapshot reads, whichever writer does it; an agent's heartbeat (`last_seen`) does
not. Readers see the new version exactly when they see the new rows. The numbers come from a
sequence, which a rollback does not take back: a version seen inside a transaction that rolled back
is never the version of other rows. PostgreSQL only: elsewhere the cache is not used.
"""

from django.db import migrations

NODE_COLUMNS = "name, labels, status, cpu_milli, memory_mib"
GPU_COLUMNS = "node_id, uuid, index, model, memory_mib, nvlink_peers, numa_node, healthy, cordoned"

FORWARD = f"""
CREATE SEQUENCE fleet_version_seq;
CREATE TABLE fleet_fleetversion (id smallint PRIMARY KEY CHECK (id = 1), version bigint NOT NULL);
INSERT INTO fleet_fleetversion VALUES (1, nextval('fleet_version_seq'));
CREATE FUNCTION fleet_bump_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE fleet_fleetversion SET version = nextval('fleet_version_seq') WHERE id = 1;
    RETURN NULL;
END $$;
CREATE TRIGGER fleet_node_rows AFTER INSERT OR DELETE OR TRUNCATE ON fleet_node
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_bump_version();
CREATE TRIGGER fleet_node_columns AFTER UPDATE OF {NODE_COLUMNS} ON fleet_node
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_bump_version();
CREATE TRIGGER fleet_gpu_rows AFTER INSERT OR DELETE OR TRUNCATE ON fleet_gpu
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_bump_version();
CREATE TRIGGER fleet_gpu_columns AFTER UPDATE OF {GPU_COLUMNS} ON fleet_gpu
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_bump_version();
"""

BACKWARD = """
DROP TRIGGER fleet_node_rows ON fleet_node;
DROP TRIGGER fleet_node_columns ON fleet_node;
DROP TRIGGER fleet_gpu_rows ON fleet_gpu;
DROP TRIGGER fleet_gpu_columns ON fleet_gpu;
DROP FUNCTION fleet_bump_version();
DROP TABLE fleet_fleetversion;
DROP SEQUENCE fleet_version_seq;
"""


def _on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0006_node_address"),
    ]

    operations = [
        migrations.RunPython(_on_postgresql(FORWARD), _on_postgresql(BACKWARD)),
    ]
