"""What an API server refusal means, and who must act on it.

The API server answers 403 for very different things: the caller may not do it (RBAC), an
admission plugin refused the object (PodSecurity, RuntimeClass, ResourceQuota), or the namespace is
not ready yet (its `default` ServiceAccount is created by a controller a moment after the
namespace). Some pass by themselves and are worth retrying; the others need an operator, and the
text says what to fix, since it ends up as the reservation's reason.

An RBAC refusal is final only once the server is ready: a kube-apiserver that has just restarted
answers 403 to everyone for a couple of seconds, until its authorizer's cache of Roles has synced
(`confirm_when_ready`; `api.KubeApi` asks again after the server says it is ready).

The messages matched here are the ones kube-apiserver 1.2x-1.3x writes (plugin/pkg/admission/*,
staging/src/k8s.io/pod-security-admission, the RBAC authorizer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    transient: bool
    text: str
    confirm_when_ready: bool = False  # final only if it is still refused once the server is ready


_SERVICE_ACCOUNT = re.compile(r'error looking up service account ([^/\s]+)/([^:\s]+): serviceaccount "[^"]*" not found')
_QUOTA = re.compile(r"exceeded quota: (.*)")
_RUNTIME_CLASS = re.compile(r'RuntimeClass "([^"]+)" not found')
_POD_SECURITY = re.compile(r'violates PodSecurity "([^"]+)": (.*)')
_RBAC = re.compile(r'User "([^"]+)" cannot (\w+) resource "([^"]+)"(?: in API group "[^"]*")?'
                   r'(?: in the namespace "([^"]+)")?')
_TERMINATING = re.compile(r"unable to create new content in namespace (\S+) because it is being terminated")


def explain(status: int, reason: str, message: str) -> Refusal:
    """Sort a refusal (HTTP status, Status.reason, Status.message) into transient or final, in words
    an operator can act on. 429 and 5xx are retried before this is asked."""
    if status == 403:
        if m := _SERVICE_ACCOUNT.search(message):
            return Refusal(True, f"namespace {m[1]} has no ServiceAccount {m[2]} yet (Kubernetes creates it "
                                 "a moment after the namespace); trying again")
        if m := _QUOTA.search(message):
            return Refusal(True, f"the namespace's ResourceQuota is used up ({m[1]}); trying again when "
                                 "there is room")
        if m := _RUNTIME_CLASS.search(message):
            return Refusal(False, f"RuntimeClass {m[1]} is missing: install the NVIDIA container toolkit "
                                  f"(it brings RuntimeClass {m[1]}; deploy/optional/runtimeclass.yaml creates "
                                  "it too) or set TESSERA_RUNTIME_CLASS to the one the GPU nodes use "
                                  "(empty: none)")
        if m := _POD_SECURITY.search(message):
            return Refusal(False, f"the namespace's PodSecurity level {m[1]} refuses the pod ({m[2]}): "
                                  "Tessera's pods meet 'baseline'; label the namespace "
                                  "pod-security.kubernetes.io/enforce=baseline")
        if m := _TERMINATING.search(message):
            return Refusal(False, f"namespace {m[1]} is being deleted")
        if m := _RBAC.search(message):
            if m[4] and (m[2], m[3]) != ("create", "pods"):
                # binding, patching, deleting, logs and events in a namespace: granted there only
                return Refusal(False, f"{m[1]} may not {m[2]} {m[3]} in namespace {m[4]}: Tessera places "
                                      f"pods only in namespaces that grant it; apply "
                                      f"deploy/optional/team-namespace.yaml with namespace {m[4]}",
                               confirm_when_ready=True)
            where = f" in namespace {m[4]}" if m[4] else " cluster-wide"
            return Refusal(False, f"{m[1]} may not {m[2]} {m[3]}{where}: apply deploy/portal/rbac.yaml "
                                  "(and a Role for each namespace Tessera creates pods in)",
                           confirm_when_ready=True)
        return Refusal(False, f"forbidden: {message or reason}")
    if status == 401:
        return Refusal(False, f"the API server does not accept Tessera's credentials ({message or reason})")
    if status == 422:
        return Refusal(False, f"the API server found the manifest invalid: {message or reason}")
    return Refusal(False, f"HTTP {status} {reason}: {message}")
