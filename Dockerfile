# One image for every PML service; the service is chosen by the command
# (`python -m pml_search`, `python -m pml_ingest.worker pass1`, ...).
# Multi-stage: the build stage resolves the locked dependencies and generates the gRPC code;
# the runtime stage holds the virtual environment alone and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_FROZEN=1 \
    UV_PROJECT_ENVIRONMENT=/opt/pml/venv
RUN pip install --no-cache-dir "uv==0.13.9"
WORKDIR /src
# Dependencies first, from the lockfile and the workspace members' manifests only, so that a
# change of source code does not reinstall them.
COPY pyproject.toml uv.lock .python-version ./
COPY libs/common/pyproject.toml libs/common/
COPY libs/proto/pyproject.toml libs/proto/
COPY libs/shgat/pyproject.toml libs/shgat/
COPY services/search/pyproject.toml services/search/
COPY services/scorer/pyproject.toml services/scorer/
COPY services/planner/pyproject.toml services/planner/
COPY services/trainer/pyproject.toml services/trainer/
COPY services/ingest/pyproject.toml services/ingest/
COPY cli/pyproject.toml cli/
RUN uv sync --all-packages --no-install-workspace
COPY libs libs
COPY services services
COPY cli cli
COPY proto proto
# The gRPC code is generated with the dev tools (grpcio-tools); the second sync installs the
# workspace as regular packages and removes the dev tools again.
RUN /opt/pml/venv/bin/python -m grpc_tools.protoc -I proto --python_out=libs/proto \
      --grpc_python_out=libs/proto proto/pml/v1/*.proto \
 && uv sync --all-packages --no-dev --no-editable

FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --system --uid 10001 --user-group --home-dir /nonexistent --no-create-home pml
COPY --from=build /opt/pml/venv /opt/pml/venv
# The root file system may be read-only (compose and Kubernetes mount it so): anything a
# library caches goes to /tmp, which both mount as a writable scratch volume.
ENV PATH=/opt/pml/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp XDG_CACHE_HOME=/tmp/.cache \
    PML_GRPC_HOST=0.0.0.0 PML_LOG_FORMAT=json
WORKDIR /tmp
USER 10001:10001
CMD ["python", "-m", "pml_search"]
