# ratemeshd as a container image FROM scratch: a statically linked binary and a default
# configuration, nothing else (no shell, no libc, no certificates, no /etc/passwd).
#
# No base image can be pulled, so nothing is compiled inside Docker: the binary is built on the
# host and handed in through a small build context. Build with
#
#     bash deploy/docker/build-image.sh           # tags ratemeshd:test (IMAGE=... to change)
#
# which runs
#
#     RUSTFLAGS='-C target-feature=+crt-static' \
#         cargo build --release --target x86_64-unknown-linux-gnu -p ratemeshd
#
# into target/static, checks that the result is a static executable, and builds this file in a
# context holding only `ratemeshd`, `ratemesh.toml` (deploy/docker/ratemesh.toml), `bin/ratelimit` (a
# symbolic link to /ratemeshd) and this file.
#
# Run a single node (HTTP API on port 8080, Envoy RLS gRPC on 8081):
#
#     docker run --rm -p 127.0.0.1:8080:8080 ratemeshd:test
#
# Cluster nodes override the default configuration with RATEMESH_* variables (gossip and QUIC on
# the container's address, a shared secret, seeds) or mount their own file over
# /etc/ratemesh/ratemesh.toml: see docker-compose.yml. The C library cannot resolve names in the
# image (static glibc without NSS modules), but ratemesh resolves seed names (host:port) with its
# own resolver, reading /etc/resolv.conf and /etc/hosts: see deploy/compose/scaled.yml and
# deploy/kubernetes.
FROM scratch

COPY ratemeshd /ratemeshd
# /bin/ratelimit -> /ratemeshd: started under that name (the command of Envoy Gateway's rate
# limit Deployment, and of envoyproxy/ratelimit's image), ratemeshd runs `envoy-ratelimit`.
COPY bin /bin
COPY ratemesh.toml /etc/ratemesh/ratemesh.toml
# The conventional data directory ([node] data_dir, off by default), owned by the daemon's user:
# a named volume mounted here starts with this owner, so the daemon can write its snapshots.
COPY --chown=65532:65532 data /var/lib/ratemesh

# Not root: any uid works; the only files the daemon writes are in its data directory, when
# one is configured. 65532 is the customary "nonroot".
USER 65532:65532

# HTTP API, Envoy Rate Limit Service (gRPC), gossip (UDP), QUIC peer transport (UDP).
EXPOSE 8080/tcp 8081/tcp 7946/udp 7947/udp

ENTRYPOINT ["/ratemeshd"]
CMD ["serve", "--config", "/etc/ratemesh/ratemesh.toml"]
