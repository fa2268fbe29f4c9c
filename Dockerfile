# polygw container image: the Debian package (debian/, `make deb`) built in
# one stage and installed into a clean debian:bookworm-slim in the next.
#
#   docker build -t polygw:0.1.0 .
#   docker run --rm -v /run/polygw:/run/polygw polygw:0.1.0     # the demo config
#
# The image runs as the package's `polygw` user, pinned to uid/gid 10001
# (numeric, so Kubernetes' runAsNonRoot can verify it; deploy/k8s/ uses it).
# Configuration: /etc/polygw/polygw.yaml (mount your own over it); API keys
# from a mounted file (api_key_file, rotated without a restart) or the
# environment (api_key_env). Logs (JSON lines, one access-log line per call)
# go to stderr.

FROM debian:bookworm-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential debhelper dpkg-dev fakeroot pkg-config check \
        libev-dev libmsgpack-dev libyaml-dev libcurl4-openssl-dev libjansson-dev \
        libhiredis-dev libsystemd-dev libhttp-parser-dev libssl-dev libprotobuf-c-dev protobuf-c-compiler \
        zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build/polygw
COPY . .
# dpkg-buildpackage writes the packages next to the tree, in /build. The
# unit tests run as part of the build (DEB_BUILD_OPTIONS=nocheck skips them).
RUN dpkg-buildpackage -us -uc -b

FROM debian:bookworm-slim
# The package's postinst keeps an existing polygw user: create it first
# with fixed ids.
RUN groupadd --system --gid 10001 polygw \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "polygw LLM API governance sidecar" polygw
COPY --from=build /build/polygw_*.deb /tmp/
# curl: the Kubernetes probes ask /healthz and /readyz over the HTTP socket
# (deploy/k8s/pod-sidecar.yaml).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends /tmp/polygw_*.deb curl \
 && rm -rf /var/lib/apt/lists/* /tmp/*.deb \
 && install -d -o 10001 -g 10001 -m 0750 /run/polygw
USER 10001:10001
ENTRYPOINT ["/usr/sbin/polygw"]
CMD ["--config", "/etc/polygw/polygw.yaml"]
