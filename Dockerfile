# One image for every PML service; the service is chosen by the command
# (`python -m pml_search`, `python -m pml_trainer`, ...). Multi-stage, runs as a non-root user.

FROM python:3.11-slim-bookworm AS build
ENV UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_FROZEN=1
RUN pip install --no-cache-dir "uv==0.13.9"
WORKDIR /src
COPY pyproject.toml uv.lock .python-version ./
COPY libs libs
COPY services services
COPY cli cli
COPY proto proto
# Generate the gRPC code with the dev tools, then build a runtime venv without them.
RUN uv sync --all-packages \
 && uv run --no-sync python -m grpc_tools.protoc -I proto --python_out=libs/proto \
      --grpc_python_out=libs/proto proto/pml/v1/*.proto \
 && rm -rf .venv \
 && uv sync --all-packages --no-dev --no-editable

FROM python:3.11-slim-bookworm AS runtime
RUN useradd --system --uid 10001 --home-dir /app pml
COPY --from=build --chown=pml:pml /src/.venv /app/.venv
ENV PATH=/app/.venv/bin:$PATH PYTHONUNBUFFERED=1 PML_GRPC_HOST=0.0.0.0 PML_LOG_FORMAT=json
WORKDIR /app
USER 10001
CMD ["python", "-m", "pml_search"]
