#!/usr/bin/env bash
# Builds the ratemeshd container image FROM scratch (see the Dockerfile at the repository root).
#
# No image can be pulled here, so nothing is compiled inside Docker: the static binary is built
# on the host (deploy/docker/static-binary.sh) and copied with the Dockerfile and the default
# configuration (deploy/docker/ratemesh.toml) into a throwaway build context, with an empty
# directory that becomes the image's /var/lib/ratemesh (the conventional data directory).
#
#   bash deploy/docker/build-image.sh                 # -> ratemeshd:test
#   IMAGE=ratemeshd:dev bash deploy/docker/build-image.sh
#
# Environment: IMAGE (tag, default ratemeshd:test), STATIC_TARGET_DIR (see static-binary.sh).
# Prints the image id on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."

image=${IMAGE:-ratemeshd:test}
command -v docker >/dev/null || { echo "build-image: docker is required and missing" >&2; exit 1; }

binary=$(bash deploy/docker/static-binary.sh | tail -n 1)

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# Without its debug line tables (the release profile keeps them for backtraces): a quarter of
# the size. Symbols stay, so a panic's backtrace still names functions.
command -v strip >/dev/null || { echo "build-image: strip (binutils) is required and missing" >&2; exit 1; }
strip --strip-debug -o "$context/ratemeshd" "$binary"
cp deploy/docker/ratemesh.toml "$context/ratemesh.toml"
cp Dockerfile "$context/Dockerfile"
mkdir "$context/data" # /var/lib/ratemesh in the image, owned by the daemon's user
# /bin/ratelimit: the command Envoy Gateway's rate limit Deployment runs; ratemeshd started
# under that name runs `ratemeshd envoy-ratelimit` (docs/integrations/envoy-gateway.md).
mkdir "$context/bin"
ln -s /ratemeshd "$context/bin/ratelimit"
# The image's default configuration must be valid, as is (no RATEMESH_ overrides), for this binary.
env -i "$context/ratemeshd" validate --config "$context/ratemesh.toml" >&2

# The classic builder: BuildKit needs the buildx plugin, which this machine's Docker lacks, and a
# FROM scratch image of two COPYs gains nothing from it.
DOCKER_BUILDKIT=0 docker build --quiet -t "$image" "$context" >/dev/null 2>"$context/build.log" ||
    { cat "$context/build.log" >&2; exit 1; }
docker image inspect -f '{{.Id}}' "$image"
