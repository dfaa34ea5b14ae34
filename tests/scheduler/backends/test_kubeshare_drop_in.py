"""KubeShare 2.0's own README examples run unchanged: its Pod (`schedulerName: kubeshare-scheduler`,
a label-safe `sharedgpu/gpu_model`) and its Job (a gang by `sharedgpu/group_name`) are placed and
bound by the portal's cycle through the kubernetes backend, with only the scheduler name configured
(TESSERA_SCHEDULER_NAMES' default). A finished pod is left for its logs and its owner's TTL."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from scheduler.backends.base import PLACEMENT_ANNOTATION
from scheduler.backends.kubernetes.webhook import share_patch

from .test_kubectl_end_to_end import portal_on_kubernetes, sync_until  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db

# As printed in KubeShare 2.0's README (NTHU-LSALAB/KubeShare), byte for byte but the namespace.
README_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: mnist
  labels:
    "sharedgpu/gpu_request": "0.5"
    "sharedgpu/gpu_limit": "1.0"
    "sharedgpu/gpu_model": "NVIDIA-GeForce-GTX-1080"
spec:
  schedulerName: kubeshare-scheduler
  restartPolicy: Never
  containers:
    - name: pytorch
      image:  riyazhu/mnist:test
      command: ["sh", "-c", "sleep infinity"]
      imagePullPolicy: Always #IfNotPresent
"""

README_JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: lstm-g
  labels:
    app: lstm-g
spec:
  completions: 5
  parallelism: 5
  template:
    metadata:
      name: lstm-o
      labels:
        "sharedgpu/gpu_request": "0.5"
        "sharedgpu/gpu_limit": "1.0"
        "sharedgpu/group_name": "a"
        "sharedgpu/group_headcount": "5"
        "sharedgpu/group_threshold": "0.2"
        "sharedgpu/priority": "100"
    spec:
      schedulerName: kubeshare-scheduler
      restartPolicy: Never
      containers:
        - name: pytorch
          image:  riyazhu/lstm-wiki2:test
          # command: ["sh", "-c", "sleep infinity"]
          imagePullPolicy: IfNotPresent
          volumeMounts:
          - name: datasets
            mountPath: "/datasets/"
      volumes:
        - name: datasets
          hostPath:
            path: "/home/riya/experiment/datasets/"
"""


@pytest.fixture
def gtx_node(portal_on_kubernetes, apiserver):  # noqa: F811 - the fixture imported above
    """A node whose GPUs NVML calls "NVIDIA GeForce GTX 1080" (the README's model, with a space)."""
    from portal.fleet.models import Gpu, Node
    from portal.tenancy.models import Quota

    Quota.objects.filter(team__slug="vision", gpu_model="*").update(gpus=16)  # room for the Job's 5 pods
    node = Node.objects.create(name="gtx-node-1")
    for i in range(4):
        Gpu.objects.create(node=node, uuid=f"GPU-1080aaaa-0000-4000-8000-00000000000{i}", index=i,
                           model="NVIDIA GeForce GTX 1080", memory_mib=8192)
    apiserver.add_node("gtx-node-1")
    apiserver.pod_mutators.append(share_patch)  # the webhook, as deployed
    return portal_on_kubernetes


def job_pods(apiserver, count=5):
    """The Job controller's pods: the template as it is, a generated name, the Job as owner."""
    job = yaml.safe_load(README_JOB)
    names = []
    for i in range(count):
        template = copy.deepcopy(job["spec"]["template"])
        meta = template["metadata"]
        meta.pop("name")
        meta["name"] = f"lstm-g-{i:05d}"
        meta["namespace"] = "team-vision"
        meta["labels"] |= {"batch.kubernetes.io/job-name": "lstm-g", "job-name": "lstm-g"}
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "lstm-g",
                                    "uid": "00000000-0000-4000-8000-00000000000j", "controller": True}]
        apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]})
        names.append(meta["name"])
    return names


def test_the_readme_pod_runs_unchanged_on_the_gpu_model_named_label_safe(gtx_node, apiserver):
    from portal.reservations.models import Reservation

    pod = yaml.safe_load(README_POD)
    pod["metadata"]["namespace"] = "team-vision"
    apiserver.create_pod(pod)
    gtx_node()
    r = Reservation.objects.get(pod_name="mnist")
    assert r.gpu_model == "NVIDIA GeForce GTX 1080" and r.priority == 0  # KubeShare's default priority
    bound = apiserver.pod("team-vision", "mnist")
    assert bound["spec"]["nodeName"] == "gtx-node-1"
    assert bound["spec"]["containers"][0]["resources"]["limits"] == {"tessera.io/gpu-share": "1"}
    placement = json.loads(bound["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    assert placement["request"] == 0.5 and placement["limit"] == 1.0
    assert not apiserver.events()


def test_the_readme_job_is_one_gang_by_group_name_and_its_finished_pods_are_kept(gtx_node, apiserver):
    from portal.placement import tasks
    from portal.reservations.models import Reservation

    names = job_pods(apiserver)
    gtx_node()
    rows = list(Reservation.objects.filter(pod_name__in=names))
    assert len(rows) == 5, [e["message"] for e in apiserver.events()]
    assert {r.group_name for r in rows} == {"a"} and {r.priority for r in rows} == {100}
    assert all(apiserver.pod("team-vision", n)["spec"].get("nodeName") for n in names), (
        [(r.state, r.state_reason) for r in rows], [e["message"] for e in apiserver.events()])
    for name in names:
        apiserver.set_pod_phase("team-vision", name, "Succeeded")
    sync_until(lambda: set(Reservation.objects.filter(pod_name__in=names).values_list("state", flat=True))
               == {"succeeded"})
    gtx_node()  # a cycle, its housekeeping included
    tasks.reconcile()
    # Their shares are released; the pods stay for `kubectl logs` until the Job's TTL removes them.
    assert all(apiserver.pod("team-vision", n) is not None for n in names)
    assert not apiserver.calls("DELETE", r"/pods/lstm-g-")


def test_a_marked_kubectl_pod_that_waits_is_never_taken_for_an_orphan(gtx_node, apiserver):
    from portal.placement import tasks

    pod = yaml.safe_load(README_POD)
    pod["metadata"] |= {"namespace": "team-vision", "name": "typo"}
    pod["metadata"]["labels"]["sharedgpu/gpu_reqest"] = pod["metadata"]["labels"].pop("sharedgpu/gpu_request")
    pod["metadata"]["labels"]["sharedgpu/gpu_request"] = "2.5"  # refused: not a whole number of GPUs
    apiserver.create_pod(pod)
    assert apiserver.pod("team-vision", "typo")["metadata"]["labels"]["tessera.io/reservation"] == ""
    gtx_node()
    tasks.reconcile()  # it carries the label the watch selects, and no reservation: the user's request
    tasks.sync(0.3)
    assert apiserver.pod("team-vision", "typo") is not None
    assert not apiserver.calls("DELETE", r"/pods/typo$")
    assert len(apiserver.events()) == 1
