# syntax=docker/dockerfile:1
# outbox-relay images.
#   docker build -t outbox-relay .                      # the relay (default target: runtime)
#   docker build -t outbox-relay-spark --target spark . # + Java 17 and pyspark, for Spark jobs
# The Python minor version matches the one CI tests the package with.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- build: a venv with the relay
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/relay
# Dependencies first (they change less often than the code), then the package itself:
# a plain, non-editable install, the same one tests/integration/test_packaging.py makes.
COPY pyproject.toml README.md constraints.txt ./
COPY sql/ sql/
COPY relay/ relay/
RUN /opt/relay/bin/pip install --no-cache-dir --only-binary=asyncpg,uvloop,pydantic-core \
        -c constraints.txt ".[tracing]" \
    && /opt/relay/bin/relay --help > /dev/null

# ---------------------------------------------------------------- runtime: no compilers, non-root
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="PostgreSQL outbox to RabbitMQ relay"
RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin relay
COPY --from=build /opt/relay /opt/relay
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

# ---------------------------------------------------------------- spark: jobs that write the outbox
FROM build AS spark-build
RUN /opt/relay/bin/pip install --no-cache-dir -c constraints.txt ".[spark]"

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
COPY --from=spark-build /opt/relay /opt/relay
# No SPARK_LOCAL_IP here: session() binds local runs to the loopback itself, and a driver or
# executor of a real cluster must advertise an address the others can reach.
ENV PATH=/opt/relay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/relay/bin/python \
    RELAY_SPARK_JDBC_JAR=/usr/share/java/postgresql.jar
WORKDIR /home/relay
USER 10001:10001
ENTRYPOINT ["python"]

# The default target is the relay.
FROM runtime
