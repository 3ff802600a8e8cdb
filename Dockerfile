# syntax=docker/dockerfile:1
# Build a wheel in a throw-away stage; the final image has the wheel's install and nothing else.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY patcher ./patcher
RUN pip install --no-cache-dir build==1.2.2.post1 && python -m build --wheel --outdir /dist

FROM python:3.11-slim
LABEL org.opencontainers.image.title="scheduler-patcher" \
      org.opencontainers.image.description="Plugs a scheduler extender into static-pod kube-schedulers, reversibly" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/scheduler-patcher/scheduler-patcher"
COPY --from=build /dist/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl && rm -f /tmp/*.whl
# Root only because the kubelet's manifest folder and the scheduler's files are root-owned on the node;
# the DaemonSet drops every capability and forbids privilege escalation.
# hadolint ignore=DL3002
USER 0
ENTRYPOINT ["scheduler-patcher"]
CMD ["run"]
