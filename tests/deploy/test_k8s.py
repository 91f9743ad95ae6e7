"""Static checks of deploy/k8s: the overlays are rendered with kustomize and every object is
validated offline against the Kubernetes schemas of `kubernetes-validate`; then what the schemas
cannot know: probes, ports, settings, secrets, network flows and what each overlay claims."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pml_common.local_runtime import REDIS_MAXMEMORY_POLICY
from pml_common.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SETTINGS = {f"PML_{name.upper()}" for name in Settings.model_fields}
#: The Kubernetes version the manifests target (gRPC probes are GA from 1.27).
KUBERNETES_VERSION = "1.32.0"
LAYOUTS = ["base", "overlays/dev", "overlays/prod"]
PASSES = ["chunking", "pass1", "pass2a", "pass2b", "pass3"]
API_PORTS = {"search": "search_port", "scorer": "scorer_port", "planner": "planner_port"}
API_PORTS |= {"ingest": "ingest_port", "trainer": "trainer_port"}
WORKLOADS = ("Deployment", "StatefulSet")
GO_BIN = str(Path.home() / "go" / "bin")

Obj = dict[str, Any]


def _kustomize(layout: str) -> list[str]:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize", str(K8S / layout)]
    # `make deps` installs the kustomize Go module when kubectl is missing
    kustomize = shutil.which("kustomize") or shutil.which("kustomize", path=GO_BIN)
    if kustomize:
        return [kustomize, "build", str(K8S / layout)]
    pytest.fail("neither kubectl nor kustomize is installed: run `make deps`")


@cache
def rendered(layout: str) -> tuple[Obj, ...]:
    out = subprocess.run(_kustomize(layout), check=True, capture_output=True, text=True).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def of_kind(layout: str, *kinds: str) -> list[Obj]:
    return [o for o in rendered(layout) if o["kind"] in kinds]


def named(layout: str, kind: str, name: str) -> Obj:
    return next(o for o in of_kind(layout, kind) if o["metadata"]["name"] == name)


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def is_pml(workload: Obj) -> bool:
    return pod_labels(workload).get("app.kubernetes.io/component") in {"api", "worker"}


def pml_containers(layout: str) -> Iterator[tuple[Obj, Obj]]:
    for workload in of_kind(layout, "Deployment"):
        if is_pml(workload):
            for container in pod_spec(workload)["containers"]:
                yield workload, container


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value, op = labels.get(expr["key"]), expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True


def container_ports(workload: Obj) -> dict[str, int]:
    """Port name (and the number itself, as text) -> number, over the pod's containers."""
    ports: dict[str, int] = {}
    for container in pod_spec(workload)["containers"]:
        for port in container.get("ports", []):
            ports[str(port["containerPort"])] = port["containerPort"]
            if "name" in port:
                ports[port["name"]] = port["containerPort"]
    return ports


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_rendered_object_is_valid_for_kubernetes(layout: str) -> None:
    objects = rendered(layout)
    assert len(objects) > 30
    for obj in objects:
        # strict: an unknown field (a typo, a misplaced key) is an error, not ignored
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_broken_object() -> None:
    """The schema check above is able to fail: a misplaced field is reported."""
    deployment = yaml.safe_load(yaml.safe_dump(named("base", "Deployment", "search")))
    probe = pod_spec(deployment)["containers"][0]["readinessProbe"]
    probe["grpcPort"] = probe.pop("grpc")["port"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_one_deployment_per_service_and_per_ingestion_pass() -> None:
    names = {d["metadata"]["name"] for d in of_kind("base", "Deployment") if is_pml(d)}
    assert names == set(API_PORTS) | {f"ingest-{p}" for p in PASSES}
    for p in PASSES:
        container = pod_spec(named("base", "Deployment", f"ingest-{p}"))["containers"][0]
        assert container["command"] == ["python", "-m", "pml_ingest.worker", p]
    for name in API_PORTS:
        container = pod_spec(named("base", "Deployment", name))["containers"][0]
        assert container["command"] == ["python", "-m", f"pml_{name}"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pml_containers_listen_on_the_ports_of_the_settings(layout: str) -> None:
    defaults = Settings()
    for workload, container in pml_containers(layout):
        name = workload["metadata"]["name"]
        field = API_PORTS.get(name, "ingest_worker_port")
        assert [p["containerPort"] for p in container["ports"]] == [getattr(defaults, field)]


def _probe_ports(probe: Obj) -> list[int | str]:
    if "grpc" in probe:
        return [probe["grpc"]["port"]]
    if "httpGet" in probe:
        return [probe["httpGet"]["port"]]
    if "tcpSocket" in probe:
        return [probe["tcpSocket"]["port"]]
    command = probe["exec"]["command"]
    if command[:3] == ["python", "-m", "pml_common.healthcheck"]:
        return [int(command[3].rsplit(":", 1)[1])]
    return []  # a store's own client (redis-cli ping)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_probes_name_real_container_ports(layout: str) -> None:
    for workload in of_kind(layout, *WORKLOADS):
        ports = container_ports(workload)
        for container in pod_spec(workload)["containers"]:
            assert "readinessProbe" in container and "livenessProbe" in container, container["name"]
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                for port in _probe_ports(container.get(kind) or {"exec": {"command": []}}):
                    assert str(port) in ports, (layout, container["name"], kind, port)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pml_probes_use_grpc_health(layout: str) -> None:
    for _, container in pml_containers(layout):
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[kind]
            grpc = "grpc" in probe
            exec_health = probe.get("exec", {}).get("command", [])[:3] == [
                "python",
                "-m",
                "pml_common.healthcheck",
            ]
            assert grpc or exec_health, (container["name"], kind)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_container_is_hardened_and_bounded(layout: str) -> None:
    for workload in of_kind(layout, *WORKLOADS):
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        writable_root = "pml.dev/writable-root" in (
            workload["spec"]["template"]["metadata"].get("annotations") or {}
        )
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
            assert context["readOnlyRootFilesystem"] is not writable_root, container["name"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), container["name"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_config_keys_and_env_vars_are_settings(layout: str) -> None:
    config = named_config(layout)
    assert set(config["data"]) <= SETTINGS, set(config["data"]) - SETTINGS
    for _, container in pml_containers(layout):
        env = {e["name"] for e in container.get("env", [])}
        assert env <= SETTINGS, (container["name"], env - SETTINGS)
        refs = {s["configMapRef"]["name"] for s in container["envFrom"]}
        assert refs == {config["metadata"]["name"]}
    Settings.model_validate(
        {
            k.removeprefix("PML_").lower(): v
            for k, v in config["data"].items()
            if not k.endswith("_FILE")
        }
    )


def named_config(layout: str) -> Obj:
    """The PML ConfigMap (kustomize appends a content hash to its name)."""
    return next(
        o for o in of_kind(layout, "ConfigMap") if o["metadata"]["name"].startswith("pml-config")
    )


def _operator_secret_keys() -> set[str]:
    """Keys of `pml-secrets` in the `kubectl create secret` command the base documents."""
    text = (K8S / "base" / "kustomization.yaml").read_text()
    return {
        line.split("--from-literal=")[1].split("=")[0]
        for line in text.splitlines()
        if "--from-literal=" in line
    }


@pytest.mark.parametrize("layout", LAYOUTS)
def test_secret_files_and_keys_are_mounted_and_documented(layout: str) -> None:
    config = named_config(layout)["data"]
    files = {k: v for k, v in config.items() if k.endswith("_FILE")}
    assert {"PML_REDIS_PASSWORD_FILE", "PML_NEO4J_PASSWORD_FILE"} <= set(files)
    documented = _operator_secret_keys()
    for _, container in pml_containers(layout):
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        for setting, path in files.items():
            folder, key = path.rsplit("/", 1)
            assert folder in mounts, (container["name"], setting)
            if folder == "/etc/pml/secrets":
                assert key in documented, (setting, key)
    for workload in of_kind(layout, "StatefulSet"):
        for container in pod_spec(workload)["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "pml-secrets" and ref["key"] in documented, env


def test_security_settings_of_the_settings_module_are_wired_in_prod() -> None:
    """Every TLS and auth setting that names a file or switches a feature is set in prod."""
    wanted = {
        s
        for s in SETTINGS
        if s.startswith(("PML_TLS_", "PML_AUTH_"))
        and (s.endswith(("_FILE", "_ENABLED")) or s == "PML_TLS_CLIENT_AUTH")
    }
    # Optional extras an operator adds when needed: other callers' tokens, a server name.
    wanted -= {"PML_AUTH_TOKENS_FILE"}
    config = named_config("overlays/prod")["data"]
    assert wanted <= set(config), wanted - set(config)
    assert config["PML_TLS_ENABLED"] == "true" and config["PML_AUTH_ENABLED"] == "true"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_services_hpas_and_pdbs_point_at_real_pods(layout: str) -> None:
    workloads = of_kind(layout, *WORKLOADS)
    for service in of_kind(layout, "Service"):
        selector = {"matchLabels": service["spec"]["selector"]}
        targets = [w for w in workloads if selects(selector, pod_labels(w))]
        assert targets, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert all(str(port["targetPort"]) in container_ports(w) for w in targets)
    deployments = {d["metadata"]["name"] for d in of_kind(layout, "Deployment")}
    hpas = {h["spec"]["scaleTargetRef"]["name"] for h in of_kind(layout, "HorizontalPodAutoscaler")}
    assert hpas == {"search", "scorer"} and hpas <= deployments
    for pdb in of_kind(layout, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"], pod_labels(w)) for w in workloads)


# --- network policies -------------------------------------------------------------------------


def _peer_selects(peer: Obj, workload: Obj) -> bool:
    if "namespaceSelector" in peer:
        return False  # another namespace (cluster DNS)
    if "ipBlock" in peer:
        return peer["ipBlock"]["cidr"] == "0.0.0.0/0"
    return selects(peer["podSelector"], pod_labels(workload))


def _port_allowed(rule: Obj, target: Obj, port: int) -> bool:
    if "ports" not in rule:
        return True
    ports = container_ports(target)
    return any(ports.get(str(p["port"])) == port for p in rule["ports"])


def _rule_allows(rule: Obj, peer_key: str, other: Obj, target: Obj, port: int) -> bool:
    if not _port_allowed(rule, target, port):
        return False
    return peer_key not in rule or any(_peer_selects(peer, other) for peer in rule[peer_key])


def _side_allows(layout: str, pod: Obj, direction: str, other: Obj, target: Obj, port: int) -> bool:
    """Egress of `pod` to `other`, or ingress of `pod` from `other`, on `target`'s `port`."""
    relevant = [
        p
        for p in of_kind(layout, "NetworkPolicy")
        if direction.capitalize() in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], pod_labels(pod))
    ]
    if not relevant:
        return True  # no policy isolates this pod in that direction
    peer_key = "to" if direction == "egress" else "from"
    return any(
        _rule_allows(rule, peer_key, other, target, port)
        for policy in relevant
        for rule in policy["spec"].get(direction, [])
    )


def _allowed(layout: str, source: Obj, target: Obj, port: int) -> bool:
    """Whether the policies let `source` open a TCP connection to `target`:`port`."""
    return _side_allows(layout, source, "egress", target, target, port) and _side_allows(
        layout, target, "ingress", source, target, port
    )


def _workload(layout: str, name: str) -> Obj:
    return next(w for w in of_kind(layout, *WORKLOADS) if w["metadata"]["name"] == name)


PML_PROCESSES = [*API_PORTS, *(f"ingest-{p}" for p in PASSES)]
ALLOWED = [
    *((name, "redis", 6379) for name in PML_PROCESSES),
    *((name, "neo4j", 7687) for name in PML_PROCESSES),
    *((name, "otel-collector", 4317) for name in PML_PROCESSES),
    ("planner", "scorer", 50052),
    ("planner", "search", 50051),
    ("search", "qdrant", 6333),
    ("otel-collector", "jaeger", 4317),
]
DENIED = [
    ("scorer", "qdrant", 6333),  # the vector store is search's alone
    ("trainer", "qdrant", 6333),
    ("ingest-pass1", "qdrant", 6333),
    ("trainer", "search", 50051),  # only the planner calls other services
    ("search", "scorer", 50052),
    ("scorer", "planner", 50053),
    ("redis", "neo4j", 7687),
    ("qdrant", "redis", 6379),
    ("jaeger", "redis", 6379),
    ("search", "jaeger", 4317),  # spans go through the collector
    ("search", "redis", 7687),  # only the Redis port
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_network_policies_allow_exactly_the_architecture_flows(layout: str) -> None:
    policies = of_kind(layout, "NetworkPolicy")
    deny = [p for p in policies if p["metadata"]["name"] == "default-deny"]
    assert deny and deny[0]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for source, target, port in ALLOWED:
        src, dst = _workload(layout, source), _workload(layout, target)
        assert _allowed(layout, src, dst, port), f"{source} -> {target}:{port} should be allowed"
    for source, target, port in DENIED:
        src, dst = _workload(layout, source), _workload(layout, target)
        assert not _allowed(layout, src, dst, port), f"{source} -> {target}:{port} is open"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_network_policy_selector_matches_a_workload(layout: str) -> None:
    workloads = of_kind(layout, *WORKLOADS)
    for policy in of_kind(layout, "NetworkPolicy"):
        spec = policy["spec"]
        assert any(selects(spec["podSelector"], pod_labels(w)) for w in workloads)
        rules = [*spec.get("ingress", []), *spec.get("egress", [])]
        for rule in rules:
            for peer in [*rule.get("from", []), *rule.get("to", [])]:
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    matched = [w for w in workloads if selects(peer["podSelector"], pod_labels(w))]
                    assert matched, (policy["metadata"]["name"], peer)


# --- what each overlay claims -----------------------------------------------------------------


def _replicas(layout: str) -> dict[str, int]:
    return {d["metadata"]["name"]: d["spec"]["replicas"] for d in of_kind(layout, "Deployment")}


def test_trainer_runs_two_replicas_where_it_matters() -> None:
    assert _replicas("base")["trainer"] == 2
    assert _replicas("overlays/prod")["trainer"] == 2


def test_dev_overlay_is_one_small_replica_of_everything() -> None:
    assert set(_replicas("overlays/dev").values()) == {1}
    assert {o["metadata"].get("namespace") for o in rendered("overlays/dev")} == {"pml-dev"}
    for hpa in of_kind("overlays/dev", "HorizontalPodAutoscaler"):
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    for _, container in pml_containers("overlays/dev"):
        assert container["resources"]["requests"] == {"cpu": "100m", "memory": "384Mi"}
    base = {c["name"]: c["resources"]["requests"] for _, c in pml_containers("base")}
    assert base["search"] != {"cpu": "100m", "memory": "384Mi"}
    assert named_config("overlays/dev")["data"]["PML_LOG_LEVEL"] == "DEBUG"


def test_prod_overlay_scales_secures_and_pins_the_image() -> None:
    replicas, base = _replicas("overlays/prod"), _replicas("base")
    assert (replicas["planner"], replicas["ingest"]) == (2, 2)
    assert (base["planner"], base["ingest"]) == (1, 1)
    assert {o["metadata"].get("namespace") for o in rendered("overlays/prod")} == {"pml"}
    for hpa in of_kind("overlays/prod", "HorizontalPodAutoscaler"):
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 20)
    for workload, container in pml_containers("overlays/prod"):
        assert container["image"] == "registry.example.com/pml:0.1.0"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/etc/pml/tls" in mounts, workload["metadata"]["name"]
        assert "grpc" not in container["readinessProbe"]  # kubelet gRPC probes cannot do TLS
        if workload["metadata"]["name"] in {"search", "scorer"}:
            assert container["resources"]["limits"] == {"cpu": "4", "memory": "4Gi"}
    neo4j = named("overlays/prod", "StatefulSet", "neo4j")
    assert neo4j["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {
        "storage": "100Gi"
    }
    data = named_config("overlays/prod")["data"]
    assert data["PML_OTEL_SAMPLE_RATIO"] == "0.2"


def test_only_search_reaches_the_vector_store_with_its_api_key() -> None:
    documented = _operator_secret_keys()
    for workload, container in pml_containers("base"):
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if workload["metadata"]["name"] == "search":
            assert env["PML_QDRANT_URL"] == "http://qdrant:6333"
            folder, key = env["PML_QDRANT_API_KEY_FILE"].rsplit("/", 1)
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert folder == "/etc/pml/secrets" and folder in mounts and key in documented
        else:
            assert "PML_QDRANT_URL" not in env and "PML_QDRANT_API_KEY_FILE" not in env
    [qdrant] = [o for o in of_kind("base", "StatefulSet") if o["metadata"]["name"] == "qdrant"]
    env = {e["name"]: e for e in pod_spec(qdrant)["containers"][0]["env"]}
    ref = env["QDRANT__SERVICE__API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "pml-secrets", "key": "qdrant-api-key"}


def test_collector_pipeline_is_the_one_compose_uses() -> None:
    k8s = (K8S / "base" / "otel-collector-config.yaml").read_text()
    compose = (ROOT / "deploy" / "otel-collector" / "config.yaml").read_text()
    assert yaml.safe_load(k8s) == yaml.safe_load(compose)


#: Multipliers of Redis's memory units and of Kubernetes quantities.
_REDIS_UNITS = {"kb": 1024, "mb": 1024**2, "gb": 1024**3, "k": 10**3, "m": 10**6, "g": 10**9}
_K8S_UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "K": 10**3, "M": 10**6, "G": 10**9}


def _bytes(value: str, units: dict[str, int]) -> int:
    for unit in sorted(units, key=len, reverse=True):
        if value.endswith(unit):
            return int(value.removesuffix(unit)) * units[unit]
    return int(value)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_redis_evicts_only_keys_with_a_ttl_within_its_container(layout: str) -> None:
    """The memory policy of docs/operations.md ("Memory"), with room left under the limit for
    the AOF rewrite's copy-on-write."""
    (container,) = pod_spec(named(layout, "StatefulSet", "redis"))["containers"]
    args = container["args"]
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--maxmemory-policy"] == REDIS_MAXMEMORY_POLICY == "volatile-lru"
    assert options["--appendonly"] == "yes"
    maxmemory = _bytes(options["--maxmemory"], _REDIS_UNITS)
    limit = _bytes(container["resources"]["limits"]["memory"], _K8S_UNITS)
    assert 0 < maxmemory <= limit // 2
