# Redis for the Responses API's shared store (TANDEM_RESPONSE_STORE=redis), from Debian's own redis-server package:
# no registry image is needed, online (BASE_IMAGE=python:3.11-slim-bookworm, compose.yaml's default base) or
# offline (tandem/debian-base:bookworm, compose.offline.yaml). Runs as Debian's `redis` user; data in /data.
ARG BASE_IMAGE=tandem/debian-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data && chmod 0700 /data
# outside /etc/redis (Debian makes it 0750 redis:redis): a pod runs it as uid 10001
COPY redis.conf /usr/local/etc/tandem-redis.conf
USER redis
EXPOSE 6379
CMD ["redis-server", "/usr/local/etc/tandem-redis.conf"]
