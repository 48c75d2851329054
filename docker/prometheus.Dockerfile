# Prometheus from Debian's own package, for hosts that cannot pull prom/prometheus (compose.offline.yaml).
# Same paths and user as the official image's use in compose.yaml; wget is its healthcheck's client.
ARG BASE_IMAGE=tandem/debian-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
