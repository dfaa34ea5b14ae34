"""The portal pointed at the fake API server as in deploy/portal (TESSERA_BACKEND=kubernetes), shared
by the tests that run placement against it (scheduler/backends, portal/placement)."""

from __future__ import annotations

import json


def point_portal_at(apiserver, settings, tmp_path, monkeypatch) -> None:
    """A kubeconfig naming `apiserver`, the kubernetes backend, no Redis (locks in-process)."""
    from portal.placement.locking import forget_locks

    # A real server (TESSERA_TEST_KUBE_API, real_apiserver.py) accepts only its token; the fake any.
    token = getattr(apiserver, "token", "any")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": apiserver.url}}],
        "users": [{"name": "tessera", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tessera"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.TESSERA_BACKEND = "kubernetes"
    settings.TESSERA_NAMESPACE = "tessera"
    settings.TESSERA_LOCK_REDIS_URL = ""
    settings.REDIS_URL = ""
    forget_locks()
