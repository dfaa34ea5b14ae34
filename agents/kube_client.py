"""The Kubernetes API client of the node-side programs (device plugin, DRA driver): in-cluster
credentials, or a host and token for tests, and no retries of the client library's own (each
caller retries where it knows what is worth it)."""

from __future__ import annotations

from kubernetes import client, config


def kube_api_client(*, host: str | None = None, token: str | None = None) -> client.ApiClient:
    configuration = client.Configuration()
    if host:
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.retries = False
    return client.ApiClient(configuration)
