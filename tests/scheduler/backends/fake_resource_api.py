"""`resource.k8s.io/v1` for the fake API server (Dynamic Resource Allocation, Kubernetes 1.34+):
ResourceSlice, DeviceClass (cluster-scoped), ResourceClaim with its status subresource and
ResourceClaimTemplate (namespaced). `fake_apiserver.FakeApiServer` routes `/apis/resource.k8s.io/v1/...`
here; objects live in its store (so lists, watches and resourceVersions work as for pods).

Field names and limits are those of k8s.io/api/resource/v1/types.go (1.34) and KEP-5075 (consumable
capacity); the schema itself (unknown fields, types) is checked by kubernetes-validate as for every
object the fake takes. On top of it, what the real server's validation says that matters to us:

- ResourceSlice: exactly one of nodeName/nodeSelector/allNodes/perDeviceNodeSelection; at most 128
  devices with unique DNS-label names; at most 32 attributes and capacities together per device; an
  attribute has exactly one of int/bool/string/version, strings at most 64 characters;
  `pool.resourceSliceCount` > 0, `pool.generation` >= 0; a capacity's `requestPolicy` only on a
  device with `allowMultipleAllocations: true`, at most one of validValues/validRange, `default`
  required with either and within it, `validRange` min <= default <= max <= value, step divides
  default and max, min + step <= value, validValues ascending, at most 10, the largest <= value;
  driver, nodeName and pool.name immutable.
- ResourceClaim: the spec is immutable; `status.allocation` cannot be changed once set (only
  removed, with no reservedFor left); `status.reservedFor` at most 256 entries with unique uids and
  only on an allocated claim.
- every update (PUT, merge PATCH) with `metadata.resourceVersion` that is not the stored one: 409.

And, with `check_allocations` (default True), what the real API server leaves to the allocator (the
kube-scheduler's DRA plugin, or ours) and would only show later as two pods on one GPU: a status
write whose allocation names a device of no current slice (highest generation of its pool), consumes
a capacity off the device's request policy, would take a device beyond its capacity summed over every
allocated claim, or takes a device without `allowMultipleAllocations` that another claim holds, is
refused with 422 and the reason. Against a real server these are checked by `over_commitments()` in
the tests instead.

Deleting a Node (`FakeApiServer.remove_node`) deletes the ResourceSlices whose ownerReferences name
it, as the garbage collector does.
"""

from __future__ import annotations

import pickle
import re
import uuid
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

GROUP_PREFIX = "/apis/resource.k8s.io/v1/"
API_VERSION = "resource.k8s.io/v1"
# plural -> (kind, namespaced)
RESOURCES = {
    "resourceslices": ("ResourceSlice", False),
    "deviceclasses": ("DeviceClass", False),
    "resourceclaims": ("ResourceClaim", True),
    "resourceclaimtemplates": ("ResourceClaimTemplate", True),
}
MAX_DEVICES = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_LENGTH = 64
MAX_RESERVED_FOR = 256
MAX_VALID_VALUES = 10
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def deep_copy(obj: Any) -> Any:
    """`copy.deepcopy` of the JSON-like objects the fake stores, through pickle: four times faster.
    The fake copies what every request reads or writes, and the benchmarks run it beside the client
    on the same cores, where deepcopy's Python walk was most of a claim status write's cost."""
    return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


class Invalid(Exception):
    """422 Invalid, with the field path and what is wrong, as the real server words it."""


def quantity(value: Any, where: str) -> Decimal:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError) as exc:
        raise Invalid(f"{where}: Invalid value: {value!r}: quantities must match the regular expression") from exc


def route(path: str) -> tuple[str, str, str, str] | None:
    """(plural, namespace, name, subresource) of a resource.k8s.io/v1 path, or None."""
    if not path.startswith(GROUP_PREFIX):
        return None
    parts = path[len(GROUP_PREFIX):].strip("/").split("/")
    ns = ""
    if len(parts) >= 2 and parts[0] == "namespaces":
        ns, parts = parts[1], parts[2:]
    if not parts or parts[0] not in RESOURCES or len(parts) > 3:
        return None
    plural = parts[0]
    if RESOURCES[plural][1] != bool(ns) and not (not ns and len(parts) == 1):
        return None  # a namespaced kind named without its namespace (except the cluster-wide list)
    return plural, ns, parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else ""


# -- ResourceSlice -------------------------------------------------------------------------------


def validate_slice(obj: dict, old: dict | None) -> None:
    spec = obj.get("spec") or {}
    name = obj["metadata"].get("name", "")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise Invalid(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
    driver = spec.get("driver", "")
    if not _DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
        raise Invalid(f"spec.driver: Invalid value: {driver!r}: a lowercase RFC 1123 subdomain of at most 63")
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        raise Invalid("spec.pool.name: Required value")
    if int(pool.get("resourceSliceCount", 0)) <= 0:
        raise Invalid(f"spec.pool.resourceSliceCount: Invalid value: {pool.get('resourceSliceCount')}: "
                      "must be greater than zero")
    if int(pool.get("generation", -1)) < 0:
        raise Invalid(f"spec.pool.generation: Invalid value: {pool.get('generation')}: must be >= 0")
    selections = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(selections) != 1:
        raise Invalid("spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                      f"`perDeviceNodeSelection` is required, got {selections or 'none'}")
    if old is not None:
        for path in (("driver",), ("nodeName",), ("pool", "name")):
            was, now = old["spec"], spec
            for key in path:
                was, now = (was or {}).get(key), (now or {}).get(key)
            if was != now:
                raise Invalid(f"spec.{'.'.join(path)}: Invalid value: {now!r}: field is immutable")
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES:
        raise Invalid(f"spec.devices: Too many: {len(devices)}: must have at most {MAX_DEVICES} items")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        dname = device.get("name", "")
        if not _DNS_LABEL.match(dname) or len(dname) > 63:
            raise Invalid(f"{where}.name: Invalid value: {dname!r}: a lowercase RFC 1123 label")
        if dname in seen:
            raise Invalid(f"{where}.name: Duplicate value: {dname!r}")
        seen.add(dname)
        _validate_device(device, where)


def _validate_device(device: dict, where: str) -> None:
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise Invalid(f"{where}: Too many: {len(attributes) + len(capacity)}: the maximum number of attributes "
                      f"and capacities combined is {MAX_ATTRIBUTES_AND_CAPACITIES}")
    for key, attr in attributes.items():
        if not _QUALIFIED.match(key):
            raise Invalid(f"{where}.attributes[{key}]: Invalid value: {key!r}: a C identifier of at most 32 "
                          "characters, optionally after a DNS subdomain and '/'")
        set_ = [k for k in ("int", "bool", "string", "version") if k in attr]
        if len(set_) != 1:
            raise Invalid(f"{where}.attributes[{key}]: Invalid value: exactly one value must be specified")
        value = attr[set_[0]]
        if set_[0] in ("string", "version") and len(value) > MAX_ATTRIBUTE_LENGTH:
            raise Invalid(f"{where}.attributes[{key}].{set_[0]}: Too long: may not be more than "
                          f"{MAX_ATTRIBUTE_LENGTH} bytes")
        if set_[0] == "version" and not _SEMVER.match(value):
            raise Invalid(f"{where}.attributes[{key}].version: Invalid value: {value!r}: must be a semantic version")
    shared = bool(device.get("allowMultipleAllocations"))
    for key, cap in capacity.items():
        if not _QUALIFIED.match(key):
            raise Invalid(f"{where}.capacity[{key}]: Invalid value: {key!r}")
        value = quantity(cap.get("value"), f"{where}.capacity[{key}].value")
        policy = cap.get("requestPolicy")
        if policy is None:
            continue
        at = f"{where}.capacity[{key}].requestPolicy"
        if not shared:
            raise Invalid(f"{at}: Forbidden: allowMultipleAllocations must be true to set a requestPolicy")
        _validate_policy(policy, value, at)


def _validate_policy(policy: dict, value: Decimal, at: str) -> None:
    valid_values, valid_range = policy.get("validValues"), policy.get("validRange")
    if valid_values and valid_range:
        raise Invalid(f"{at}: Invalid value: must not set more than one ValidRequestValues")
    default = quantity(policy["default"], f"{at}.default") if policy.get("default") is not None else None
    if (valid_values or valid_range) and default is None:
        raise Invalid(f"{at}.default: Required value: required when validValues or validRange is set")
    if default is not None and default > value:
        raise Invalid(f"{at}.default: Invalid value: {policy['default']}: must be less than or equal to capacity value")
    if valid_values:
        values = [quantity(v, f"{at}.validValues") for v in valid_values]
        if len(values) > MAX_VALID_VALUES:
            raise Invalid(f"{at}.validValues: Too many: {len(values)}: must have at most {MAX_VALID_VALUES} items")
        if values != sorted(set(values)):
            raise Invalid(f"{at}.validValues: Invalid value: must be sorted in ascending order without duplicates")
        if values[-1] > value:
            raise Invalid(f"{at}.validValues: Invalid value: must be less than or equal to capacity value")
        if default not in values:
            raise Invalid(f"{at}.default: Invalid value: {policy['default']}: default value is not valid "
                          "according to the requestPolicy")
    if valid_range:
        low = quantity(valid_range.get("min"), f"{at}.validRange.min") if valid_range.get("min") is not None else None
        if low is None:
            raise Invalid(f"{at}.validRange.min: Required value")
        high = quantity(valid_range["max"], f"{at}.validRange.max") if valid_range.get("max") is not None else None
        step = quantity(valid_range["step"], f"{at}.validRange.step") if valid_range.get("step") is not None else None
        if not Decimal(0) <= low <= value:
            raise Invalid(f"{at}.validRange.min: Invalid value: {valid_range['min']}: must be within 0 and capacity")
        if high is not None and not low <= high <= value:
            raise Invalid(f"{at}.validRange.max: Invalid value: {valid_range['max']}: must be within min and capacity")
        if not (low <= default and (high is None or default <= high)):
            raise Invalid(f"{at}.default: Invalid value: {policy['default']}: default value is not valid "
                          "according to the requestPolicy")
        if step is not None:
            if step <= 0 or low + step > value:
                raise Invalid(f"{at}.validRange.step: Invalid value: {valid_range['step']}: "
                              "min + step must be less than or equal to the capacity value")
            for what, amount in (("default", default), ("validRange.max", high)):
                if amount is not None and amount % step:
                    raise Invalid(f"{at}.{what}: Invalid value: {amount}: must be a multiple of step {step}")


def policy_problem(cap: dict, amount: Decimal) -> str | None:
    """Why `amount` is not a value the capacity's request policy lets one allocation consume (the
    allocator rounds requests up onto the policy's grid, so a consumed amount must lie on it)."""
    value = parse_quantity(cap["value"])
    policy = cap.get("requestPolicy") or {}
    if amount < 0 or amount > value:
        return f"{amount} is not within 0 and the capacity {value}"
    if policy.get("validValues"):
        allowed = [parse_quantity(v) for v in policy["validValues"]]
        return None if amount in allowed else f"{amount} is none of the valid values {[str(v) for v in allowed]}"
    valid_range = policy.get("validRange")
    if valid_range:
        low = parse_quantity(valid_range["min"])
        high = parse_quantity(valid_range["max"]) if valid_range.get("max") is not None else value
        if not low <= amount <= high:
            return f"{amount} is not within the valid range {low}..{high}"
        if valid_range.get("step") is not None and (amount - low) % parse_quantity(valid_range["step"]):
            return f"{amount} is not min {low} plus a multiple of step {valid_range['step']}"
    return None


# -- ResourceClaim -------------------------------------------------------------------------------


def validate_claim_status(obj: dict, old: dict) -> None:
    status, was = obj.get("status") or {}, old.get("status") or {}
    allocation, old_allocation = status.get("allocation"), was.get("allocation")
    reserved = status.get("reservedFor") or []
    if old_allocation and allocation and allocation != old_allocation:
        raise Invalid("status.allocation: Invalid value: field is immutable")
    if len(reserved) > MAX_RESERVED_FOR:
        raise Invalid(f"status.reservedFor: Too many: {len(reserved)}: must have at most {MAX_RESERVED_FOR} items")
    uids = [r.get("uid") for r in reserved]
    if len(set(uids)) != len(uids):
        raise Invalid("status.reservedFor: Duplicate value: the same uid twice")
    if reserved and not allocation:
        raise Invalid("status.reservedFor: Forbidden: may not be set when the claim is not allocated")
    if old_allocation and not allocation and was.get("reservedFor") and reserved:
        raise Invalid("status.allocation: Forbidden: may not be removed while the claim is reserved")
    if obj.get("spec") != old.get("spec"):
        raise Invalid("spec: Invalid value: field is immutable")


def current_devices(slices: list[dict]) -> dict[tuple[str, str, str], dict]:
    """(driver, pool, device) -> device, from the slices of each pool's highest generation."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, -1), int(s["spec"]["pool"]["generation"]))
    out = {}
    for s in slices:
        driver, pool = s["spec"]["driver"], s["spec"]["pool"]
        if int(pool["generation"]) == newest[(driver, pool["name"])]:
            for device in s["spec"].get("devices") or ():
                out[(driver, pool["name"], device["name"])] = device
    return out


def allocation_problems(claims: list[dict], slices: list[dict]) -> list[str]:
    """What an allocator would never have written: devices of no current slice, amounts off the
    request policy, capacity summed over the claims beyond the device's, an exclusive device twice."""
    devices = current_devices(slices)
    used: dict[tuple[str, str, str, str], Decimal] = {}
    holders: dict[tuple[str, str, str], list[str]] = {}
    problems = []
    for claim in claims:
        who = f"{claim['metadata'].get('namespace')}/{claim['metadata']['name']}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            key = (result["driver"], result["pool"], result["device"])
            device = devices.get(key)
            if device is None:
                problems.append(f"{who}: device {'/'.join(key)} is in no current ResourceSlice")
                continue
            holders.setdefault(key, []).append(who)
            if not device.get("allowMultipleAllocations"):
                continue
            consumed = result.get("consumedCapacity") or {}
            for name, cap in (device.get("capacity") or {}).items():
                if name not in consumed:
                    problems.append(f"{who}: consumedCapacity of {'/'.join(key)} lacks {name!r}")
                    continue
                amount = parse_quantity(consumed[name])
                why = policy_problem(cap, amount)
                if why:
                    problems.append(f"{who}: {name} of {'/'.join(key)}: {why}")
                used[(*key, name)] = used.get((*key, name), Decimal(0)) + amount
    for (driver, pool, dev, name), total in used.items():
        value = parse_quantity(devices[(driver, pool, dev)]["capacity"][name]["value"])
        if total > value:
            problems.append(f"{name} of {driver}/{pool}/{dev}: {total} consumed in all, the device has {value}")
    for key, who in holders.items():
        if not devices[key].get("allowMultipleAllocations") and len(who) > 1:
            problems.append(f"device {'/'.join(key)} does not allow multiple allocations but is allocated to "
                            f"{', '.join(who)}")
    return problems


def new_object(kind: str, ns: str, body: dict) -> dict:
    obj = deep_copy(body)
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.update(uid=str(uuid.uuid4()), generation=1)
    if ns:
        meta["namespace"] = ns
    if kind == "ResourceClaim":
        obj.setdefault("status", {})
    return obj
