"""The official client, wrapped: every call has a timeout, transient failures (HTTP 429/5xx,
timeouts, refused or reset connections) are retried with capped exponential backoff and jitter, and
what is left comes out as the backend errors of `scheduler.backends.base`.

404 and 409 are not errors here but answers the caller interprets (`NotFound`, `Conflict`): a 409
on create means "adopt", on a binding "already bound", on a patch with a resourceVersion "re-read".

A 403 is not always final: admission refuses a pod while the namespace's `default` ServiceAccount is
not created yet, or while a ResourceQuota is used up, and both pass by themselves. `refusals.explain`
sorts them out and says, for the final ones, what the operator must fix.

A restart is not a failure of the request: while the server does not answer, a call probes its
`/readyz` and goes on as soon as it answers (within `RetryPolicy.outage_s`), instead of sleeping a
backoff sized for a server under load; and an RBAC refusal, which a freshly restarted server answers
until its authorizer's cache has synced, is final only if it is still there once the server is ready
and a moment (`recheck_s`) has passed.
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
from kubernetes.client.rest import RESTResponse

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
    # A server that stops answering (restart, upgrade) is probed this often, this long, per call:
    # within the placement task's time limit (TESSERA_CLUSTER_TASK_LIMIT_S, 60 s).
    probe_s: float = 0.25
    outage_s: float = 20.0
    # A restarted kube-apiserver refuses everyone for about 2 s after it is ready, until its RBAC
    # cache has synced: an RBAC refusal is asked again this long after readiness before it is final.
    recheck_s: float = 3.0

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
        self.sleep = sleep  # every wait between tries goes through it (tests see the waits)
        self._rng = random.Random(seed)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` with the policy's timeout; retried while the failure is transient."""
        kwargs.setdefault("_request_timeout", self.policy.timeout)
        last = ""
        attempt = 0
        confirming = False  # an RBAC refusal is being asked again once the server is ready
        outage_ends: float | None = None  # when a server that stopped answering is given up on
        while True:
            unreachable = False
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
                        if confirming or not refusal.confirm_when_ready:
                            raise PermanentBackendError(f"{what}: {refusal.text}") from exc
                        confirming = True
                        log.info("%s refused (%s); asking again once the API server is ready", what, refusal.text)
                        self.await_ready(time.monotonic() + self.policy.outage_s)
                        self.sleep(self.policy.recheck_s)
                        continue
                    last = refusal.text
                else:
                    last = f"HTTP {exc.status} {reason}: {message}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # Timeouts, refused or reset connections, truncated answers.
                last = f"{type(exc).__name__}: {exc}"
                unreachable = True
            attempt += 1
            if attempt >= self.policy.attempts:
                raise TransientBackendError(f"{what}: {last} (after {self.policy.attempts} attempts)")
            if unreachable:
                if outage_ends is None:
                    outage_ends = time.monotonic() + self.policy.outage_s
                if self.ready():
                    self._backoff(what, attempt, last)  # up all along: a timeout or a reset, not a restart
                elif not self.await_ready(outage_ends):
                    raise TransientBackendError(
                        f"{what}: the API server did not answer for {self.policy.outage_s:g} s ({last})")
                else:
                    log.info("%s failed (%s); the API server answers again, retry %d", what, last, attempt)
            else:
                self._backoff(what, attempt, last)


    def call_json(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        """`call`, answered as the JSON dict the API server sent (no client-model round trip)."""
        resp = self.call(what, fn, *args, _preload_content=False, **kwargs)
        try:
            return json.loads(resp.data)
        except ValueError as exc:
            raise TransientBackendError(f"{what}: the API server sent invalid JSON") from exc
        finally:
            resp.release_conn()

    def send_json(self, what: str, method: str, path: str, body: dict,
                  content_type: str = "application/json", *, answer: bool = True) -> dict | None:
        """`call_json` of one request on `path` (from the API root), past the generated client: its
        walk over the body (`sanitize_for_serialization`), its parameter handling and urllib3's
        parsing of the whole URL cost a claim's status write more CPU than the request itself (it
        goes straight to the host's connection pool, unless a proxy needs the whole URL). Auth, TLS,
        timeouts, retries and errors are the same as through the generated client. `answer=False`:
        the caller needs only to know it was taken, so the answer is not parsed."""
        client_ = self.api_client
        manager = client_.rest_client.pool_manager
        host = client_.configuration.host
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()

        def send(_request_timeout: tuple[float, float]) -> Any:
            headers = {**client_.default_headers, "Content-Type": content_type, "Accept": "application/json"}
            client_.update_params_for_auth(headers, [], ["BearerToken"])
            timeout = urllib3.Timeout(connect=_request_timeout[0], read=_request_timeout[1])
            if type(manager) is urllib3.PoolManager:
                resp = manager.connection_from_url(host).urlopen(method, path, body=data, headers=headers,
                                                                   timeout=timeout, retries=False, redirect=False)
            else:
                resp = manager.request(method, host + path, body=data, headers=headers, timeout=timeout)
            if not 200 <= resp.status <= 299:
                raise ApiException(http_resp=RESTResponse(resp))
            return resp

        resp = self.call(what, send)
        if not answer:
            return None
        try:
            return json.loads(resp.data)
        except ValueError as exc:
            raise TransientBackendError(f"{what}: the API server sent invalid JSON") from exc

    def bind(self, namespace: str, name: str, binding: dict) -> None:
        """POST the pod's Binding (`send_json`: every bind of a batch pays the generated client's
        CPU otherwise; its model for Binding could not parse the Status the server answers anyway)."""
        self.send_json("bind pod", "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding,
                       answer=False)

    def _backoff(self, what: str, attempt: int, last: str) -> None:
        delay = self.policy.delay(attempt - 1, self._rng)
        log.info("%s failed (%s); retry %d in %.2f s", what, last, attempt, delay)
        self.sleep(delay)

    def ready(self) -> bool:
        """Whether the API server says it is ready (`/readyz`, which every caller may read)."""
        try:
            resp = self.api_client.call_api("/readyz", "GET", auth_settings=["BearerToken"],
                                            _return_http_data_only=True, _preload_content=False,
                                            _request_timeout=self.policy.timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError):
            return False
        try:
            resp.read()  # to its end, so that the connection can be reused
            return resp.status == 200
        finally:
            resp.release_conn()

    def await_ready(self, until: float) -> bool:
        """Probe `/readyz` every `probe_s` until it answers or `until` (monotonic) passes."""
        while not self.ready():
            if time.monotonic() >= until:
                return False
            self.sleep(self.policy.probe_s)
        return True

    def close(self) -> None:
        self.api_client.close()
