# syntax=docker/dockerfile:1
# The spotguard image: every function through the `spotguard` command
#   spotguard serve admission --tls-cert ... --tls-key ...
#   spotguard serve spot-interruption --port 8080 [--sqs-queue-url URL]
# Build:  docker build -t REGISTRY/spotguard:TAG .     (README.md "Shipping")
#
# The install step is scripts/install-image, the script tests/infra/test_image.py
# runs in a fresh virtual environment: keep every install step in that script.
# It installs requirements-image.txt with pip --require-hashes (scripts/lock-image
# writes it from requirements.txt's pins) and leaves no pip in /opt/spotguard; the
# runtime stage also drops the base image's own pip. Not in the image: the
# simulated cluster and the operator's commands (demo, simulate, replay,
# snapshot), which run on a laptop.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHON=python3
WORKDIR /src
COPY requirements-image.txt requirements-image-build.txt pyproject.toml README.md ./
COPY scripts/install-image scripts/install-image
COPY shared/ shared/
RUN scripts/install-image /opt/spotguard

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="spotguard" \
      org.opencontainers.image.description="Keep Kubernetes workloads serving on spot capacity" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/spotguard /opt/spotguard
# No installer in the runtime layer: the base image's pip goes too.
RUN python -m pip uninstall --quiet --yes pip && rm -rf /root/.cache /usr/local/lib/python3*/ensurepip
# Read-only root filesystem: nothing is written next to the code (bytecode was
# compiled at build time); temporary files go to /tmp (mount an emptyDir there).
ENV PATH=/opt/spotguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The same non-root user the manifests' securityContext names.
USER 65532:65532
EXPOSE 8080 8443 9090
ENTRYPOINT ["spotguard"]
CMD ["--help"]
