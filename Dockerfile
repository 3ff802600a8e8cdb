# The base image, pinned by tag and digest (multi-arch index). Override it with
#   make image IMAGE_BUILD_FLAGS='--build-arg PYTHON_IMAGE=<registry>/python:3.11-slim@sha256:<digest>'
# (a mirror, a newer patch release, or a local stand-in without a digest); docs/release.md says how to refresh it.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# Build a wheel in a throw-away stage; the final image has the wheel's install and nothing else.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY patcher ./patcher
RUN pip install --no-cache-dir build==1.2.2.post1 && python -m build --wheel --outdir /dist

FROM ${PYTHON_IMAGE}
# Set by `make image` (the project version and the git commit).
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="scheduler-patcher" \
      org.opencontainers.image.description="Plugs a scheduler extender into static-pod kube-schedulers, reversibly" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/scheduler-patcher/scheduler-patcher"
COPY --from=build /dist/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl && rm -f /tmp/*.whl
# Root because the kubelet's manifest folder and the manifest are root-owned (0700/0600) on the node: the agent's
# DaemonSet and the restore Job set uid 0 themselves and drop every capability; `kubectl debug node/...` (the
# uninstall fallback) runs the image's own user. The gatekeeper's pod sets uid 65532.
# hadolint ignore=DL3002
USER 0
ENTRYPOINT ["scheduler-patcher"]
CMD ["run"]
