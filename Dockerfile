# syntax=docker/dockerfile:1
# outbox-relay images.
#   docker build -t outbox-relay .                      # the relay (default target: runtime)
#   docker build -t outbox-relay-spark --target spark . # + Java 17 and pyspark, for Spark jobs
# The Python minor version matches the one CI tests the package with.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- deps: the venv's dependencies
# First, from pyproject.toml and constraints.txt alone: a change to the code rebuilds none of
# this (tomllib reads the lists, so they are written in one place).
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml constraints.txt ./
RUN python -m venv /opt/relay \
    && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['tracing']))" > requirements.txt \
    && /opt/relay/bin/pip install --no-cache-dir --only-binary=asyncpg,uvloop,pydantic-core \
        -c constraints.txt -r requirements.txt

# ---------------------------------------------------------------- build: the relay itself
# A plain, non-editable install, the same one tests/integration/test_packaging.py makes.
FROM deps AS build
COPY README.md ./
COPY sql/ sql/
COPY relay/ relay/
RUN /opt/relay/bin/pip install --no-cache-dir --no-deps -c constraints.txt ".[tracing]" \
    && /opt/relay/bin/relay --help > /dev/null

# ---------------------------------------------------------------- runtime: no compilers, non-root
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="PostgreSQL outbox to RabbitMQ relay"
RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin relay
ENV PATH=/opt/relay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RELAY_HTTP_PORT=9000 \
    RELAY_LOG_FORMAT=json
WORKDIR /tmp
USER 10001:10001
EXPOSE 9000
# /healthz: the loop is alive. Readiness (/readyz) is for orchestrators, not for restarts.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["relay", "health"]
ENTRYPOINT ["relay"]
CMD ["run"]
# Last, so that a change to the relay rebuilds this layer alone (root-owned: USER does not
# apply to COPY, and the relay cannot change its own code).
COPY --from=build /opt/relay /opt/relay

# ---------------------------------------------------------------- spark: jobs that write the outbox
FROM deps AS spark-deps
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['optional-dependencies']['spark']))" > spark-requirements.txt \
    && /opt/relay/bin/pip install --no-cache-dir -c constraints.txt -r spark-requirements.txt

FROM spark-deps AS spark-build
COPY README.md ./
COPY sql/ sql/
COPY relay/ relay/
RUN /opt/relay/bin/pip install --no-cache-dir --no-deps -c constraints.txt ".[spark]" \
    && /opt/relay/bin/relay --help > /dev/null

FROM ${PYTHON_IMAGE} AS spark
# Java 17 for pyspark 4; Debian's PostgreSQL JDBC driver at /usr/share/java/postgresql.jar.
# The JRE's post-install script expects the man folder that slim images leave out.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --create-home --home-dir /home/relay \
       --shell /usr/sbin/nologin relay
# No SPARK_LOCAL_IP here: session() binds local runs to the loopback itself, and a driver or
# executor of a real cluster must advertise an address the others can reach.
ENV PATH=/opt/relay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/relay/bin/python \
    RELAY_SPARK_JDBC_JAR=/usr/share/java/postgresql.jar
WORKDIR /home/relay
USER 10001:10001
ENTRYPOINT ["python"]
COPY --from=spark-build /opt/relay /opt/relay

# The default target is the relay.
FROM runtime
