"""What a reservation's answer shows from other tables, for many reservations in one query: the
slug of its team, the names of its owner, node and client node, and its live allocations with
their GPU and the GPU's node.

`select_related` of the four relations and a prefetch of the allocations cost more CPU than the
rest of a list request: Django compiled ~80 columns, four joins and a second query each time, and
built five full model objects per row. Here one plain SQL statement reads just the columns shown,
keyed by the ids on the reservation rows already read (so a name always belongs to the row's own
team, owner or node), and fills in the same attributes the serializer reads: the related objects
(cached on the reservation, with only those columns loaded) and `live_allocations`, ordered as
Allocation's Meta orders them."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import connections, router

from portal import internals
from portal.fleet.models import Gpu, Node
from portal.reservations.models import Allocation, Reservation
from portal.tenancy.models import Team

ATTACHED = "live_allocations"

# One row shape for every kind of row: kind, key (id, or the allocation's reservation), name,
# and for allocations: GPU uuid, GPU index, GPU id, GPU node id, request, limit, memory.
_TEAM, _USER, _NODE, _ALLOCATION = 0, 1, 2, 3
_NAMES = "SELECT {kind}, id, {column}, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM {table} WHERE id IN ({ids})"
_ALLOCATIONS = (
    f"SELECT {_ALLOCATION}, a.reservation_id, n.name, g.uuid, g.\"index\", a.gpu_id, g.node_id, a.id,"  # noqa: S608 (our tables)
    " a.gpu_request, a.gpu_limit, a.gpu_memory_mib"
    f" FROM {Allocation._meta.db_table} a JOIN {Gpu._meta.db_table} g ON g.id = a.gpu_id"
    f" JOIN {Node._meta.db_table} n ON n.id = g.node_id"
    " WHERE a.released_at IS NULL AND a.reservation_id IN ({ids})"
)


def _partial(model, db: str, **values):
    """A model object with only these columns loaded (the others load on access, as with only())."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db(db, names, [values[n] for n in names])


def _decimal(value) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))  # SQLite may give a float


def attach(reservations) -> None:
    """Fill in what the representation of each reservation reads beyond its own row (see the
    module); reservations already filled in, and relations already cached, are left as they are."""
    todo = [r for r in reservations if ATTACHED not in r.__dict__]
    if not todo:
        return
    db = todo[0]._state.db or router.db_for_read(Reservation)
    user_model = get_user_model()
    fields = {name: Reservation._meta.get_field(name) for name in ("team", "owner", "node", "client_node")}
    caches = {name: internals.relation_cache(field) for name, field in fields.items()}
    wanted: dict[int, set[int]] = {_TEAM: set(), _USER: set(), _NODE: set()}
    for r in todo:
        for name, kind in (("team", _TEAM), ("owner", _USER), ("node", _NODE), ("client_node", _NODE)):
            key = getattr(r, fields[name].attname)
            if key is not None and not caches[name].holds(r):
                wanted[kind].add(key)
    # The allocations first: their columns give the union its types (the names' NULLs have none).
    ids = sorted({r.pk for r in todo})
    parts, params = [_ALLOCATIONS.format(ids=", ".join(["%s"] * len(ids)))], ids
    for kind, model, column in ((_TEAM, Team, "slug"), (_USER, user_model, "username"), (_NODE, Node, "name")):
        if wanted[kind]:
            ids = sorted(wanted[kind])
            parts.append(_NAMES.format(kind=kind, column=column, table=model._meta.db_table,
                                       ids=", ".join(["%s"] * len(ids))))
            params += ids
    with connections[db].cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        rows = cursor.fetchall()

    names: dict[int, dict[int, str]] = {_TEAM: {}, _USER: {}, _NODE: {}}
    allocations: list[tuple] = []
    for row in rows:
        if row[0] == _ALLOCATION:
            allocations.append(row)
        else:
            names[row[0]][row[1]] = row[2]
    related = {
        _TEAM: {pk: _partial(Team, db, id=pk, slug=slug) for pk, slug in names[_TEAM].items()},
        _USER: {pk: _partial(user_model, db, id=pk, username=name) for pk, name in names[_USER].items()},
        _NODE: {pk: _partial(Node, db, id=pk, name=name) for pk, name in names[_NODE].items()},
    }
    for r in todo:
        for name, kind in (("team", _TEAM), ("owner", _USER), ("node", _NODE), ("client_node", _NODE)):
            field = fields[name]
            obj = related[kind].get(getattr(r, field.attname))
            if obj is not None and not caches[name].holds(r):
                caches[name].put(r, obj)
        r.__dict__[ATTACHED] = []

    by_pk: dict[int, list] = {}
    for r in todo:
        by_pk.setdefault(r.pk, []).append(r)
    gpu_nodes: dict[int, Node] = {}
    gpu_node = internals.relation_cache(Gpu._meta.get_field("node"))
    allocation_gpu = internals.relation_cache(Allocation._meta.get_field("gpu"))
    allocations.sort(key=lambda row: (row[1], row[5]))  # Allocation's Meta: reservation, GPU
    for _kind, reservation_id, node_name, uuid, index, gpu_id, node_id, pk, request, limit, memory in allocations:
        node = gpu_nodes.get(node_id)
        if node is None:
            node = gpu_nodes[node_id] = _partial(Node, db, id=node_id, name=node_name)
        gpu = _partial(Gpu, db, id=gpu_id, node_id=node_id, uuid=uuid, index=index)
        gpu_node.put(gpu, node)
        allocation = _partial(Allocation, db, id=pk, reservation_id=reservation_id, gpu_id=gpu_id,
                              gpu_request=_decimal(request), gpu_limit=_decimal(limit), gpu_memory_mib=memory,
                              released_at=None)
        allocation_gpu.put(allocation, gpu)
        for r in by_pk[reservation_id]:
            r.__dict__[ATTACHED].append(allocation)
