"""The inventory YAML: the demo fleet loads, and a bad file is refused naming the file and field."""

from __future__ import annotations

import pytest

from wire.inventory import InventoryError, load_inventory, parse_inventory, pick_node, simulated_gpu_uuid


def test_the_demo_inventory_is_a_mixed_fleet(demo_inventory):
    nodes = load_inventory(demo_inventory)
    assert [n.name for n in nodes] == ["a100-node-1", "a100-node-2", "v100-node-1", "t4-node-1"]
    models = {g.model for n in nodes for g in n.gpus}
    assert models == {"A100-80GB", "V100-32GB", "T4"}
    big = nodes[0]
    assert [g.index for g in big.gpus] == list(range(8))
    assert [g.numa_node for g in big.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    uuid = {g.index: g.uuid for g in big.gpus}
    assert set(big.gpus[0].nvlink_peers) == {uuid[1], uuid[2], uuid[3]}
    assert set(big.gpus[5].nvlink_peers) == {uuid[4], uuid[6], uuid[7]}
    assert nodes[3].gpus[0].nvlink_peers == ()
    assert big.labels["tessera.io/pool"] == "training"


def test_simulated_uuids_are_stable_and_distinct_across_the_fleet(demo_inventory):
    nodes = load_inventory(demo_inventory)
    uuids = [g.uuid for n in nodes for g in n.gpus]
    assert len(set(uuids)) == len(uuids) == 18
    assert nodes[2].gpus[3].uuid == simulated_gpu_uuid("v100-node-1", 3)
    assert load_inventory(demo_inventory)[2].gpus[3].uuid == nodes[2].gpus[3].uuid


def test_gpu_indices_continue_across_groups_of_a_node():
    nodes = parse_inventory(
        "nodes:\n- name: mixed\n  gpus:\n  - {model: T4, memory_mib: 15360, count: 2}\n"
        "  - {model: L4, memory_mib: 23034, count: 2, numa: 1, nvlink_groups: [[0, 1]]}\n",
        "mixed.yaml",
    )
    gpus = nodes[0].gpus
    assert [(g.index, g.model, g.numa_node) for g in gpus] == [
        (0, "T4", 0), (1, "T4", 0), (2, "L4", 1), (3, "L4", 1)]
    assert gpus[2].nvlink_peers == (gpus[3].uuid,)


GOOD_NODE = "- name: n1\n  gpus: [{model: T4, memory_mib: 15360}]\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nodes: []", "nodes: List should have at least 1 item"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: lots}]",
         "nodes[0].gpus[0].memory_mib: Input should be a valid integer (got 'lots')"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 0}]", "nodes[0].gpus[0].memory_mib"),
        ("nodes:\n- name: N_1\n  gpus: [{model: T4, memory_mib: 1}]",
         "nodes[0].name: must be a Kubernetes node name"),
        ("nodes:\n- name: n1\n  gpus: [{memory_mib: 1}]", "nodes[0].gpus[0].model: Field required"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 1, colour: red}]",
         "nodes[0].gpus[0].colour: unknown field"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 1, count: 2, numa: [0]}]",
         "nodes[0].gpus[0].numa: a list must have one entry per GPU (2), got 1"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 1, numa: -1}]", "nodes[0].gpus[0].numa"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 1, count: 2, nvlink_groups: [[0, 2]]}]",
         "nodes[0].gpus[0].nvlink_groups: GPU 2 does not exist (count is 2)"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 1, count: 65}]", "nodes[0].gpus[0].count"),
        ("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: 1, count: 40}, "
         "{model: T4, memory_mib: 1, count: 40}]", "nodes[0].gpus: 80 GPUs, at most 64 per node"),
        ("nodes:\n" + GOOD_NODE + GOOD_NODE, "nodes: node name 'n1' appears twice"),
        ("nodes:\n- name: n1\n  labels: {zone: 'a b'}\n  gpus: [{model: T4, memory_mib: 1}]",
         "nodes[0].labels.zone: is not a valid Kubernetes label value"),
        ("version: 2\nnodes:\n" + GOOD_NODE, "version"),
        ("nodes: [", "not valid YAML at line 1"),
        ("- just a list", "the top level must be a mapping"),
    ],
)
def test_bad_inventory_is_refused_naming_the_file_and_the_field(text, says):
    with pytest.raises(InventoryError) as refused:
        parse_inventory(text, "fleet.yaml")
    assert str(refused.value).startswith("fleet.yaml: ")
    assert says in str(refused.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(InventoryError, match=r"nope\.yaml: no such file"):
        load_inventory(tmp_path / "nope.yaml")


def test_picking_a_node(demo_inventory):
    nodes = load_inventory(demo_inventory)
    assert pick_node(nodes, "t4-node-1", "demo.yaml").name == "t4-node-1"
    with pytest.raises(InventoryError, match="no node named 'gpu-9'; nodes are: a100-node-1"):
        pick_node(nodes, "gpu-9", "demo.yaml")
    with pytest.raises(InventoryError, match=r"has 4 nodes .*choose one with --node"):
        pick_node(nodes, None, "demo.yaml")
    only = parse_inventory("nodes:\n" + GOOD_NODE, "one.yaml")
    assert pick_node(only, None, "one.yaml").name == "n1"
