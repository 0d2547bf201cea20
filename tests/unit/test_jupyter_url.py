"""Where a pod's Jupyter server is: annotation, else pod IP + named port + NB_PREFIX."""

from __future__ import annotations

from typing import Any

import pytest

from agents.sources.jupyter import (
    JupyterSettings,
    NoServerUrl,
    NotKernels,
    parse_kernels,
    server_url,
    shown,
)


def pod(
    *,
    ip: str | None = "10.1.2.3",
    ports: list[dict[str, Any]] | None = None,
    env: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    sidecar: bool = False,
) -> dict[str, Any]:
    containers: list[dict[str, Any]] = []
    if sidecar:  # an Istio sidecar listed first, with ports of its own
        containers.append(
            {"name": "istio-proxy", "ports": [{"name": "http-envoy-prom", "containerPort": 15090}]}
        )
    containers.append({"name": "nb", "ports": ports or [], "env": env or []})
    return {
        "metadata": {
            "namespace": "user-alice",
            "name": "nb-alice",
            "annotations": annotations or {},
        },
        "spec": {"containers": containers},
        "status": {"podIP": ip} if ip else {},
    }


KUBEFLOW_ENV = [{"name": "NB_PREFIX", "value": "/notebook/user-alice/nb-alice"}]
S = JupyterSettings()


def test_a_kubeflow_notebook_is_found_by_its_named_port_and_nb_prefix() -> None:
    p = pod(ports=[{"name": "notebook-port", "containerPort": 8888}], env=KUBEFLOW_ENV)
    assert server_url(p, S) == "http://10.1.2.3:8888/notebook/user-alice/nb-alice"


def test_the_named_port_wins_over_an_http_named_one_and_a_sidecar() -> None:
    p = pod(
        ports=[
            {"name": "http-metrics", "containerPort": 9100},
            {"name": "notebook-port", "containerPort": 8080},
        ],
        env=KUBEFLOW_ENV,
        sidecar=True,
    )
    assert server_url(p, S) == "http://10.1.2.3:8080/notebook/user-alice/nb-alice"


def test_an_http_named_port_is_used_when_none_is_named_for_the_server() -> None:
    p = pod(
        ports=[{"name": "metrics", "containerPort": 9100}, {"name": "http", "containerPort": 8000}]
    )
    assert server_url(p, S) == "http://10.1.2.3:8000"


def test_without_ports_the_default_port_and_no_prefix() -> None:
    assert server_url(pod(), S) == "http://10.1.2.3:8888"
    assert server_url(pod(), JupyterSettings(port=9999)) == "http://10.1.2.3:9999"


@pytest.mark.parametrize(
    ("value", "prefix"),
    [("notebook/a/b/", "/notebook/a/b"), ("/", ""), ("", ""), ("  /x  ", "/x")],
)
def test_nb_prefix_is_normalised(value: str, prefix: str) -> None:
    p = pod(env=[{"name": "NB_PREFIX", "value": value}])
    assert server_url(p, S) == f"http://10.1.2.3:8888{prefix}"


def test_ipv6_pod_ips_are_bracketed() -> None:
    assert server_url(pod(ip="fd00::12"), S) == "http://[fd00::12]:8888"


def test_the_annotation_overrides_everything() -> None:
    p = pod(annotations={"nodeward.io/jupyter-url": "https://nb.example/user/alice/"}, ip=None)
    assert server_url(p, S) == "https://nb.example/user/alice"


def test_a_url_template_from_the_config() -> None:
    s = JupyterSettings(url="http://{name}.{namespace}.svc:80{prefix}")
    p = pod(env=KUBEFLOW_ENV)
    assert server_url(p, s) == "http://nb-alice.user-alice.svc:80/notebook/user-alice/nb-alice"


@pytest.mark.parametrize(
    ("p", "settings", "says"),
    [
        (pod(ip=None), S, "pod has no IP yet"),
        (pod(ip="not-an-ip"), S, "is not an IP address"),
        (pod(annotations={"nodeward.io/jupyter-url": "ftp://x"}), S, "not an http(s) URL"),
        (pod(), JupyterSettings(url="http://{nope}"), "url template"),
    ],
)
def test_a_pod_that_does_not_say_where_its_server_is(
    p: dict[str, Any], settings: JupyterSettings, says: str
) -> None:
    with pytest.raises(NoServerUrl, match=says.replace("(", r"\(").replace(")", r"\)")):
        server_url(p, settings)


def test_urls_are_shown_without_credentials_or_query() -> None:
    assert shown("http://u:pw@10.0.0.1:8888/x/api/kernels?token=abc") == (
        "http://10.0.0.1:8888/x/api/kernels"
    )


def test_kernel_lists_parse_and_other_shapes_do_not() -> None:
    kernels = parse_kernels(
        [
            {
                "id": "k1",
                "name": "python3",
                "last_activity": "2026-08-20T11:58:02.123456Z",
                "execution_state": "idle",
                "connections": 1,
                "extra": "ignored",
            }
        ]
    )
    assert kernels[0].id == "k1" and kernels[0].connections == 1
    assert kernels[0].last_activity is not None and kernels[0].last_activity.tzinfo is not None
    for bad in ({"kernels": []}, [1], [{"name": "python3"}], None):
        with pytest.raises(NotKernels):
            parse_kernels(bad)


def test_settings_are_checked_at_the_edge() -> None:
    with pytest.raises(ValueError, match="port"):
        JupyterSettings(port=0)
    with pytest.raises(ValueError, match="extra"):
        JupyterSettings(portt=1)  # type: ignore[call-arg]


async def test_an_unusable_annotated_url_is_unknown_not_an_exception() -> None:
    from agents.sources.jupyter import JupyterKernels

    kernels = JupyterKernels()
    try:
        reading = await kernels.kernels(pod(annotations={"nodeward.io/jupyter-url": "http://[x"}))
    finally:
        await kernels.aclose()
    assert not reading.known
    assert reading.error is not None and "cannot connect" in reading.error
