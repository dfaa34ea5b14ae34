"""The official client, wrapped: every call has a timeout, transient failures (HTTP 429/5xx,
timeouts, refused or reset connections) are retried with capped exponential backoff and jitter, and
what is left comes out as the backend errors of `scheduler.backends.base`.

404 and 409 are not errors here but answers the caller interprets (`NotFound`, `Conflict`): a 409
on create means "adopt", on a binding "already bound", on a patch with a resourceVersion "re-read".

A 403 is not always final: admission refuses a pod while the namespace's `default` ServiceAccount is
not created yet, or while a ResourceQuota is used up, and both pass by themselves. `refusals.explain`
sorts them out and says, for the final ones, what the operator must fix.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..base import BackendError, PermanentBackendError, TransientBackendError
from .refusals import explain

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
BIND_CONCURRENCY = 8  # pod creations in flight at once (KubernetesBackend.bind_concurrency)


class NotFound(BackendError):
    """HTTP 404: the object (or its namespace) does not exist."""


class Conflict(BackendError):
    """HTTP 409: AlreadyExists on create, Conflict on a stale resourceVersion, or a bound pod."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RetryPolicy:
    # At most about 4 x 10 s + backoff per call: Celery tasks stay short, and retry later themselves.
    attempts: int = 4
    base_s: float = 0.2
    max_s: float = 5.0
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        # Full jitter: many workers retrying at once do not stampede the API server together.
        return rng.uniform(0, min(self.max_s, self.base_s * (2 ** attempt)))

    @property
    def timeout(self) -> tuple[float, float]:
        return (self.connect_timeout_s, self.read_timeout_s)


def status_message(exc: ApiException) -> tuple[str, str]:
    """(reason, message) of the API server's Status body, or of the bare HTTP answer."""
    try:
        body = json.loads(exc.body or "")
        return str(body.get("reason") or exc.reason or ""), str(body.get("message") or exc.reason or "")
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason or ""), str(exc.reason or "")


def make_api_client(*, host: str | None = None, token: str | None = None, kubeconfig: str | None = None,
                    context: str | None = None, in_cluster: bool | None = None,
                    verify_ssl: bool = True) -> client.ApiClient:
    """An ApiClient from an explicit host, the pod's service account, or a kubeconfig file.

    urllib3's own retries are off: `KubeApi` decides what is retried, with its timeouts."""
    configuration = client.Configuration()
    if host:
        configuration.host = host.rstrip("/")
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        configuration.verify_ssl = verify_ssl
    else:
        try:
            if in_cluster or (in_cluster is None and os.environ.get("KUBERNETES_SERVICE_HOST")):
                config.load_incluster_config(client_configuration=configuration)
            else:
                # KUBECONFIG read now, not when the client library was imported.
                config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG") or None,
                                        context=context, client_configuration=configuration)
        except config.ConfigException as exc:
            raise PermanentBackendError(
                f"no usable Kubernetes configuration ({exc}): run in a pod with a service account, "
                "or set KUBECONFIG") from exc
    configuration.retries = False
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, BIND_CONCURRENCY)
    return client.ApiClient(configuration)


class KubeApi:
    """CoreV1Api calls with timeouts and retries."""

    def __init__(self, api_client: client.ApiClient, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.policy = policy or RetryPolicy()
        self._sleep = sleep
        self._rng = random.Random(seed)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` with the policy's timeout; retried while the failure is transient."""
        kwargs.setdefault("_request_timeout", self.policy.timeout)
        last = ""
        for attempt in range(self.policy.attempts):
            try:
                return fn(*args, **kwargs)
            except ApiException as exc:
                reason, message = status_message(exc)
                if exc.status == 404:
                    raise NotFound(f"{what}: {message or 'not found'}") from exc
                if exc.status == 409:
                    raise Conflict(f"{what}: {message or 'conflict'}", reason) from exc
                if exc.status not in RETRIED_STATUSES:
                    refusal = explain(exc.status, reason, message)
                    if not refusal.transient:
                        raise PermanentBackendError(f"{what}: {refusal.text}") from exc
                    last = refusal.text
                else:
                    last = f"HTTP {exc.status} {reason}: {message}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # Timeouts, refused or reset connections, truncated answers.
                last = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.policy.attempts:
                delay = self.policy.delay(attempt, self._rng)
                log.info("%s failed (%s); retry %d in %.2f s", what, last, attempt + 1, delay)
                self._sleep(delay)
        raise TransientBackendError(f"{what}: {last} (after {self.policy.attempts} attempts)")

    def close(self) -> None:
        self.api_client.close()
