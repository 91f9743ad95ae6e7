"""Static checks of the Kubernetes manifests under deploy/k8s."""

from pathlib import Path

import yaml

from pml_common.settings import Settings

BASE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
SETTINGS = {f"PML_{name.upper()}" for name in Settings.model_fields}


def _objects() -> list[dict]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    objects = []
    for resource in kustomization["resources"]:
        objects.extend(d for d in yaml.safe_load_all((BASE / resource).read_text()) if d)
    return objects


def test_config_names_exist_in_settings() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    literals = kustomization["configMapGenerator"][0]["literals"]
    names = {literal.split("=", 1)[0] for literal in literals}
    assert names <= SETTINGS, names - SETTINGS


def test_probes_name_a_declared_container_port() -> None:
    deployments = [o for o in _objects() if o["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {
        "search",
        "scorer",
        "planner",
        "trainer",
        "ingest",
    }
    for deployment in deployments:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            ports = {p["containerPort"] for p in container["ports"]}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                assert container[probe]["grpc"]["port"] in ports, (deployment, probe)
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert "limits" in container["resources"]


def test_trainer_runs_two_replicas_and_search_scorer_autoscale() -> None:
    objects = _objects()
    trainer = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "trainer"
    )
    assert trainer["spec"]["replicas"] == 2
    hpas = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in objects
        if o["kind"] == "HorizontalPodAutoscaler"
    }
    assert hpas == {"search", "scorer"}
