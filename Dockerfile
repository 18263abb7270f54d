# syntax=docker/dockerfile:1
# vramguard agent image: `docker build -t vramguard:0.1.0 .`
ARG PYTHON=python:3.11.11-slim-bookworm

FROM ${PYTHON} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON}
LABEL org.opencontainers.image.title="vramguard" \
      org.opencontainers.image.description="Enforces per-pod GPU memory quotas on Kubernetes nodes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels vramguard && rm -rf /wheels
# Non-root by default: `vramguard top` and `vramguard policy check` need nothing more. The DaemonSet runs the
# agent as uid 0 because killing other users' processes needs CAP_KILL, which a non-root process loses at exec.
USER 65532:65532
ENTRYPOINT ["vramguard"]
CMD ["run"]
