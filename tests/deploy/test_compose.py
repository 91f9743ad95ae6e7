"""Static checks of docker-compose.yml and the images it builds (no Docker engine runs here).

The file is validated against the Compose specification (compose-spec), then checked against the
settings module: ports, addresses, environment, secrets, volumes, dependencies and builds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from compose_spec import PyOptions

from pml_cli.local_stack import SERVICES
from pml_common.local_runtime import REDIS_MAXMEMORY_POLICY
from pml_common.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(TEXT)
ALL = COMPOSE["services"]
SETTINGS = {f"PML_{name.upper()}" for name in Settings.model_fields}
PASSES = ["chunking", "pass1", "pass2a", "pass2b", "pass3"]
WORKERS = {f"ingest-{p}": p for p in PASSES}
PML = [*SERVICES, *WORKERS]
STORES = {"redis", "neo4j", "qdrant", "otel-collector", "jaeger"}


def env_of(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in (ALL[name].get("environment") or {}).items()}


def settings_of(name: str) -> Settings:
    """The settings a PML container starts with (secret files are not read here)."""
    env = {k: v for k, v in env_of(name).items() if not k.endswith("_FILE")}
    return Settings.model_validate({k.removeprefix("PML_").lower(): v for k, v in env.items()})


def test_the_file_follows_the_compose_specification() -> None:
    compose = PyOptions(apply_merge=True).from_yaml(TEXT)
    compose.validate()
    assert set(compose.service_names()) == set(PML) | STORES


def test_the_specification_check_can_fail() -> None:
    broken = TEXT.replace("condition: service_healthy", "condition: service_ready", 1)
    with pytest.raises(ValueError, match="service_ready"):
        PyOptions(apply_merge=True).from_yaml(broken)


def test_every_service_has_a_healthcheck() -> None:
    for name, service in ALL.items():
        assert service["healthcheck"]["test"][0] in {"CMD", "CMD-SHELL"}, name


def test_pml_services_run_their_module_and_check_their_own_port() -> None:
    for name, (module, port_field) in SERVICES.items():
        port = getattr(settings_of(name), port_field)
        assert ALL[name]["command"] == ["python", "-m", module]
        assert ALL[name]["healthcheck"]["test"] == [
            "CMD",
            "python",
            "-m",
            "pml_common.healthcheck",
            f"127.0.0.1:{port}",
        ]


def test_one_worker_per_ingestion_pass_checks_the_worker_port() -> None:
    for name, ingestion_pass in WORKERS.items():
        port = settings_of(name).ingest_worker_port
        assert ALL[name]["command"] == ["python", "-m", "pml_ingest.worker", ingestion_pass]
        assert ALL[name]["healthcheck"]["test"][-1] == f"127.0.0.1:{port}"


def test_published_ports_are_the_services_ports_on_loopback() -> None:
    for name in PML:
        for mapping in ALL[name].get("ports", []):
            host_ip, host_port, container_port = mapping.split(":")
            _, port_field = SERVICES[name]
            assert host_ip == "127.0.0.1"
            assert int(container_port) == int(host_port) == getattr(settings_of(name), port_field)


def test_environment_names_are_settings_and_values_parse() -> None:
    for name in PML:
        names = set(env_of(name))
        assert names <= SETTINGS, (name, names - SETTINGS)
        settings_of(name)


def test_addresses_name_the_compose_service_and_its_port() -> None:
    for name in PML:
        settings = settings_of(name)
        for target, (_, port_field) in SERVICES.items():
            if target == "trainer":
                continue
            host, port = getattr(settings, f"{target}_addr").rsplit(":", 1)
            assert host == target and int(port) == getattr(settings_of(target), port_field)
        assert urlparse(settings.redis_url).hostname == "redis"
        assert urlparse(settings.neo4j_uri).hostname == "neo4j"
        assert urlparse(settings.otel_exporter_otlp_endpoint or "").hostname == "otel-collector"


def test_only_search_uses_the_qdrant_server() -> None:
    for name in PML:
        url = settings_of(name).qdrant_url
        if name == "search":
            assert url is not None and urlparse(url).hostname == "qdrant"
            assert ALL["search"]["depends_on"]["qdrant"] == {"condition": "service_healthy"}
        else:
            assert url is None, name


def test_credentials_are_secret_files_written_by_make() -> None:
    makefile = (ROOT / "Makefile").read_text()
    declared = COMPOSE["secrets"]
    for name in [*PML, "redis", "neo4j"]:
        env = env_of(name)
        assert not any(k.endswith(("_PASSWORD", "_TOKEN", "_KEY")) for k in env), name
        mounted = set(ALL[name].get("secrets", []))
        assert mounted <= set(declared), name
        for key, path in env.items():
            if key.endswith("_FILE"):
                assert path.startswith("/run/secrets/") and path.rsplit("/", 1)[1] in mounted
    for secret in declared.values():
        folder, file = secret["file"].rsplit("/", 1)
        assert folder == ".pml/compose-secrets" and file in makefile


def test_dependencies_exist_are_healthy_and_acyclic() -> None:
    for name, service in ALL.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in ALL, (name, dependency)
            assert condition == {"condition": "service_healthy"}, (name, dependency)
    for name in PML:
        assert {"redis", "neo4j", "otel-collector"} <= set(ALL[name]["depends_on"]), name
    assert {"scorer", "search"} <= set(ALL["planner"]["depends_on"])

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        deps = set(ALL[start].get("depends_on") or {})
        return goal in deps or any(reaches(d, goal, seen | {start}) for d in deps - seen)

    assert not [name for name in ALL if reaches(name, name)]


def test_volumes_are_declared_and_bind_mounts_exist() -> None:
    for name, service in ALL.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), (name, source)
            else:
                assert source in COMPOSE["volumes"], (name, source)


def test_pml_containers_are_hardened() -> None:
    for name in PML:
        service = ALL[name]
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert "/tmp" in service["tmpfs"] and "no-new-privileges:true" in service["security_opt"]


def test_neo4j_is_5_26_with_gds() -> None:
    neo4j = ALL["neo4j"]
    assert neo4j["image"].startswith("neo4j:5.26")
    assert yaml.safe_load(neo4j["environment"]["NEO4J_PLUGINS"]) == ["graph-data-science"]


def test_qdrant_requires_the_api_key_search_reads_from_its_secret() -> None:
    assert env_of("search")["PML_QDRANT_API_KEY_FILE"] == "/run/secrets/qdrant_api_key"
    assert "qdrant_api_key" in ALL["search"]["secrets"] and ALL["qdrant"]["secrets"] == [
        "qdrant_api_key"
    ]
    assert 'QDRANT__SERVICE__API_KEY="$$(cat /run/secrets/qdrant_api_key)"' in " ".join(
        ALL["qdrant"]["entrypoint"]
    )


def test_jaeger_keeps_a_bounded_number_of_traces_in_memory() -> None:
    assert int(env_of("jaeger")["MEMORY_MAX_TRACES"]) > 0


def _workspace_members() -> list[str]:
    root = (ROOT / "pyproject.toml").read_text()
    members = re.search(r"members = \[(.*?)\]", root, re.S)
    assert members is not None
    found = []
    for pattern in re.findall(r'"([^"]+)"', members.group(1)):
        found += [str(p.relative_to(ROOT)) for p in sorted(ROOT.glob(pattern)) if p.is_dir()]
    return found


def test_every_build_has_its_dockerfile_and_the_image_is_multi_stage_non_root() -> None:
    builds = {name: s["build"] for name, s in ALL.items() if "build" in s}
    assert set(PML) <= set(builds)
    for name, build in builds.items():
        context = ROOT / (build if isinstance(build, str) else build["context"])
        dockerfile = context / "Dockerfile"
        assert dockerfile.is_file(), name
        text = dockerfile.read_text()
        assert len(re.findall(r"^FROM ", text, re.M)) >= 2, name
        user = re.findall(r"^USER (\S+)", text, re.M)
        assert user and user[-1].split(":")[0] not in {"0", "root"}, name


def test_the_image_installs_every_workspace_member_from_the_lockfile() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for member in _workspace_members():
        assert f"COPY {member}/pyproject.toml {member}/" in dockerfile, member
    assert "UV_FROZEN=1" in dockerfile and "--no-dev" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", ".pml"} <= set(ignored)


def test_redis_evicts_only_keys_with_a_ttl_past_its_memory() -> None:
    """The memory policy of docs/operations.md ("Memory"): the one local runs use."""
    script = ALL["redis"]["command"][-1]
    argv = shlex.split(script.replace("$$", "$"))
    assert argv[:2] == ["exec", "redis-server"]
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert options["--maxmemory-policy"] == REDIS_MAXMEMORY_POLICY == "volatile-lru"
    assert options["--maxmemory"] == "1gb"
    assert options["--appendonly"] == "yes"
