# soapbox explorer image.
#
# The base image is a build argument so that the image builds where no image registry can be
# reached: make a local base with debootstrap and import it, e.g.
#   debootstrap --include=python3,python3-venv,python3-pip bookworm rootfs http://deb.debian.org/debian
#   tar -C rootfs -c . | docker import - local/debian-python
#   docker build --build-arg BASE_IMAGE=local/debian-python -t soapbox .
# Any image with python3 (>= 3.11) and its venv module works (python:3.11-slim included).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

WORKDIR /opt/soapbox
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY app ./app
# A virtual environment: Debian's system Python refuses system-wide pip installs (PEP 668).
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir . \
    && /opt/venv/bin/soapbox models > /dev/null
# numba caches compiled kernels; the source tree is read-only to the server's user
ENV PATH=/opt/venv/bin:$PATH NUMBA_CACHE_DIR=/tmp/numba-cache
# uploads and searches (SQLite) survive a container restart in this volume
RUN mkdir -p /data && chown nobody /data
VOLUME /data
EXPOSE 8050
USER nobody
# soapbox serve bounds every client itself (header and body deadlines, connections per address:
# app/edge.py); for a team, put deploy/nginx.conf in front (TLS, per-address limits) and add
# --trusted-proxy <nginx's address> --client-connections 0 (README, "A team's server")
CMD ["soapbox", "serve", "--host", "0.0.0.0", "--port", "8050", "--data-dir", "/data"]
