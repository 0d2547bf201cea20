# One image for every nodeward daemon: `nodeward agent gpu`, `nodeward service cordon`,
# `nodeward up`, ... (the Helm chart and docker-compose.yml pick the command).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY nodeward ./nodeward
COPY agents ./agents
COPY services ./services
COPY sim ./sim
COPY launch ./launch
# krb5 and gssapi (services.credentials.service) build against MIT Kerberos.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends gcc libc6-dev libkrb5-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/nodeward \
 && /opt/nodeward/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/nodeward/bin/pip install --no-cache-dir ".[kerberos]"

FROM python:3.11-slim
COPY --from=build /opt/nodeward /opt/nodeward
# The Kerberos libraries krb5 and gssapi load at run time.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libgssapi-krb5-2 libkrb5-3 \
 && rm -rf /var/lib/apt/lists/*
# The RBAC manifests the sim cluster enforces (`nodeward up`, `nodeward sim cluster`): it looks
# for deploy/rbac next to the installed packages (sim.cluster.rbac.default_rbac_dir).
COPY deploy/rbac /opt/nodeward/lib/python3.11/site-packages/deploy/rbac
RUN groupadd --gid 10001 nodeward \
 && useradd --uid 10001 --gid 10001 --home-dir /work --create-home --shell /usr/sbin/nologin nodeward \
 && mkdir /work/.nodeward && chown 10001:10001 /work/.nodeward
ENV PATH=/opt/nodeward/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NODEWARD_LOG__FORMAT=json
USER 10001:10001
WORKDIR /work
EXPOSE 9400
ENTRYPOINT ["nodeward"]
CMD ["--help"]
