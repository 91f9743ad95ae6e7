"""Static checks of docker-compose.yml (no Docker engine runs here)."""

from pathlib import Path

import yaml

from pml_cli.local_stack import SERVICES
from pml_common.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SETTINGS = {f"PML_{name.upper()}" for name in Settings.model_fields}


def test_every_service_has_a_healthcheck() -> None:
    missing = [name for name, svc in COMPOSE["services"].items() if "healthcheck" not in svc]
    assert missing == []


def test_every_pml_service_is_in_compose_with_its_module_and_port() -> None:
    defaults = Settings()
    for name, (module, port_field) in SERVICES.items():
        service = COMPOSE["services"][name]
        assert service["command"] == ["python", "-m", module]
        port = getattr(defaults, port_field)
        assert f"127.0.0.1:{port}" in service["healthcheck"]["test"]


def test_environment_names_exist_in_settings() -> None:
    for name, service in COMPOSE["services"].items():
        env = service.get("environment") or {}
        pml_vars = {k for k in env if k.startswith("PML_")}
        assert pml_vars <= SETTINGS, (name, pml_vars - SETTINGS)


def test_stores_tracing_and_images_are_declared() -> None:
    assert {"redis", "neo4j", "qdrant", "otel-collector", "jaeger"} <= set(COMPOSE["services"])
    assert COMPOSE["services"]["neo4j"]["image"].startswith("neo4j:5.26")
    assert (ROOT / "Dockerfile").is_file()
    collector = COMPOSE["services"]["otel-collector"]["volumes"][0].split(":")[0]
    assert (ROOT / collector).is_file()
