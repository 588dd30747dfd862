# The example Spark pipeline: a Parquet mirror of one table, kept by a streaming query that
# reads the CDC service (client/spark/mirror.py). Build from the repository root:
#   docker build -f docker/spark-mirror.Dockerfile -t mariadb-cdc-mirror .
# Run it beside the service (the password from the environment, the mirror on a volume):
#   docker run -e CDC_PASSWORD=... -v /srv/mirror:/mirror mariadb-cdc-mirror \
#       --host cdc --table shop.orders --user cdcuser
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml setup.py MANIFEST.in LICENSE README.md protocol.md ./
COPY cdcserver ./cdcserver
COPY client ./client
RUN pip install --no-cache-dir '.[spark]' \
 && useradd --system --home-dir /mirror mirror \
 && mkdir -p /mirror \
 && chown mirror /mirror

USER mirror
VOLUME /mirror
ENV PYSPARK_PYTHON=python3
ENTRYPOINT ["python", "-m", "mariadb_cdc_client.spark.mirror", "--path", "/mirror/data", \
            "--checkpoint", "/mirror/checkpoint"]
CMD ["--help"]
