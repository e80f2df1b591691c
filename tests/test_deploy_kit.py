"""The deploy kit (``deploy/``): every Kustomize overlay renders with ``kubectl``, every
object it renders validates against Kubernetes' own schemas offline, and the proxy's
configuration in each is one the proxy starts with, naming workers the overlay runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pd_policy_vllm.http.cli import configuration

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.parent.name for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))
#: The Kubernetes release the schemas are of: the kubectl these machines have.
KUBERNETES = "1.32.0"
#: Custom resources no bundled schema holds, checked by hand below.
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def _rendered(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is needed to render the kit"
    out = subprocess.run([kubectl, "kustomize", str(directory)], check=True,
                         capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _of(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_overlays_are_the_three_the_docs_name() -> None:
    assert OVERLAYS == ["epd", "kv-routing", "pd"]


@pytest.mark.parametrize("directory", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_every_object_validates_against_the_kubernetes_schemas(directory: str) -> None:
    objects = _rendered(KUSTOMIZE / directory)
    assert objects
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM:
            continue
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_a_broken_object_is_refused_by_the_validation() -> None:
    # The validation can fail: a Deployment whose probe names no port.
    (deployment,) = [o for o in _rendered(KUSTOMIZE / "base") if o["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["port"] = {"not": "a port"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_proxy_probes_its_own_routes_and_stops_within_its_grace() -> None:
    objects = _rendered(KUSTOMIZE / "base")
    spec = _of(objects, "Deployment", "pd-policy-proxy")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    config = tomllib.loads((KUSTOMIZE / "base" / "proxy.toml").read_text())
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = config["drain_seconds"] + config["pre_stop_seconds"]
    assert pre_stop + drain < spec["terminationGracePeriodSeconds"]
    # Non-root, as the image's USER is.
    user = re.search(r"^USER (\d+)", (ROOT / "deploy" / "Containerfile").read_text(), re.M)
    assert user is not None and spec["securityContext"]["runAsUser"] == int(user.group(1))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The keys come from a Secret, mounted where the configuration reads them.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (keys,) = [v for v in spec["volumes"] if "secret" in v]
    for setting in ("worker_api_key_file", "api_keys_file"):
        assert config[setting].startswith(mounts[keys["name"]] + "/")
    # The scrape is of the metrics port, which takes no key: the scraper holds none.
    monitor = _of(objects, "ServiceMonitor", "pd-policy-proxy")["spec"]["endpoints"][0]
    assert "authorization" not in monitor and monitor["path"] == "/metrics"
    service = _of(objects, "Service", "pd-policy-proxy")
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == monitor["port"]]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == port["port"] == config["metrics_port"] != config["port"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlays_configuration_starts_the_proxy_over_the_workers_it_runs(
    overlay: str, tmp_path: Path
) -> None:
    objects = _rendered(KUSTOMIZE / "overlays" / overlay)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    path = tmp_path / "proxy.toml"
    path.write_text(config_map["data"]["proxy.toml"])
    args, _ = configuration(["--config", str(path)], {})  # every key and value good
    sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    headless = {o["metadata"]["name"] for o in objects
                if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None"}  # fmt: skip
    for worker in args.workers:
        # http://POD.SERVICE:PORT: a pod of a StatefulSet behind its headless Service.
        found = re.fullmatch(r"http://([a-z0-9-]+)-(\d+)\.([a-z0-9-]+):(\d+)", worker.url)
        assert found is not None, worker.url
        name, index, service, port = found.groups()
        stateful = sets[name]["spec"]
        assert service == stateful["serviceName"] and service in headless
        assert int(index) < stateful["replicas"]
        container = stateful["template"]["spec"]["containers"][0]
        assert int(port) in {p["containerPort"] for p in container["ports"]}
        flags = " ".join(container["args"])
        # A decode described as language-model-only runs as one, and on its connector.
        assert (worker.capability == "lm-only") == ("--language-model-only" in flags)
        if worker.kv_transfer_config is not None:
            assert worker.kv_transfer_config["kv_connector"] in flags
            assert worker.kv_transfer_config["kv_role"] in flags
        if worker.kv_events_config is not None:
            assert "--kv-events-config" in flags and args.kv_routing
