#!/usr/bin/env bash
# The Kubernetes manifests (deploy/kubernetes), validated offline, run by .ci/run. No cluster is
# reachable here, so nothing is applied:
#
#  1. renders the base and every overlay with `kubectl kustomize` (kubectl 1.32, kustomize 5.5);
#  2. validates every object of each rendering against the Kubernetes 1.32 schemas, strictly (an
#     unknown field is an error), with the PyPI package kubernetes-validate in a venv made here;
#     a kind without a schema is an error too, except the ServiceMonitor (a CRD), whose fields are
#     checked by tests/kubernetes_check.py;
#  3. checks what the schemas cannot (tests/kubernetes_check.py): the StatefulSet's serviceName is
#     a headless Service publishing not-ready addresses, every selector selects the pods, every
#     Service and probe port names a container port, the ServiceMonitor selects the client
#     Service, the pods run non-root on a read-only root file system without capabilities, and
#     the Envoy example points its rate-limit cluster at the client Service's gRPC port;
#  4. validates the ConfigMap's ratemesh.toml with `ratemeshd validate` and the StatefulSet's
#     RATEMESH_ variables (values from the downward API replaced by examples): the pods' own
#     configuration, as they will load it;
#  5. the Envoy Gateway overlay (deploy/kubernetes/envoy-gateway): rendered, validated strictly,
#     checked by tests/kubernetes_envoy_gateway.py, and the ratelimit Deployment Envoy Gateway
#     would make from it validated strictly too;
#  6. the example alerting rules beside them (deploy/prometheus), with promtool:
#     tests/prometheus_rules.sh.
#
# Fails, never skips, when kubectl, Python or the package is missing.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

kubernetes_version=1.32.0
validate_version=1.37.0   # kubernetes-validate, which bundles the schemas of every version
venv=${KUBERNETES_VALIDATE_VENV:-$root/target/kubernetes-validate-venv}

require_tools kubectl python3
kubectl version --client >/dev/null 2>&1 || fail "kubectl does not run"
make_work
make_venv "$venv"
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    say "installing kubernetes-validate $validate_version into $venv"
    pip_install "$venv" kubernetes-validate "kubernetes-validate==$validate_version"
fi
"$venv/bin/python" -c 'import kubernetes_validate, yaml' || fail "kubernetes-validate is not importable"
# The static release build the other real-client steps share (RATEMESHD_BINARY: another one).
if [[ -n ${RATEMESHD_BINARY:-} ]]; then ratemeshd_binary "$RATEMESHD_BINARY"; else ratemeshd_binary; fi

renderings=(deploy/kubernetes/base deploy/kubernetes/overlays/*/)
for dir in "${renderings[@]}"; do
    dir=${dir%/}
    name=$(echo "$dir" | tr '/' '_')
    rendered=$work/$name.yaml
    kubectl kustomize "$dir" >"$rendered" 2>"$work/$name.err" ||
        fail "kubectl kustomize $dir: $(cat "$work/$name.err")"
    objects=$(grep -c '^kind:' "$rendered" || true)
    say "rendered $dir: $objects objects"

    # Strict schema validation. Its output names every object; a kind it has no schema for is
    # only a warning there, which is an error here unless it is the ServiceMonitor.
    "$venv/bin/kubernetes-validate" --strict -k "$kubernetes_version" "$rendered" >"$work/$name.validate" 2>&1 ||
        fail "kubernetes-validate $dir:
$(grep -v '^INFO' "$work/$name.validate")"
    unknown=$(grep 'Couldn.t find schema' "$work/$name.validate" | grep -v 'kind ServiceMonitor with api version monitoring.coreos.com/v1' || true)
    [[ -z $unknown ]] || fail "$dir: objects without a schema: $unknown"
    passed=$(grep -c ' passed for resource ' "$work/$name.validate" || true)
    schemaless=$(grep -c 'Couldn.t find schema' "$work/$name.validate" || true)
    ((passed + schemaless == objects)) ||
        fail "$dir: $objects objects but $passed validated and $schemaless without schema: $(cat "$work/$name.validate")"
    say "ok: $dir: $passed objects valid against the Kubernetes $kubernetes_version schemas (strict)$( ((schemaless)) && echo ", the ServiceMonitor checked below")"

    # What the schemas cannot see; writes the ratemesh.toml and the pods' variables it found.
    "$venv/bin/python" tests/kubernetes_check.py "$rendered" deploy/kubernetes/envoy/envoy.yaml \
        "$work/$name.toml" "$work/$name.env" || fail "$dir: the manifests do not fit together"

    # The pods' configuration, as they load it: the file and their RATEMESH_ variables.
    mapfile -t pod_env <"$work/$name.env"
    env -i "${pod_env[@]}" "$binary" validate --config "$work/$name.toml" >"$work/$name.config" 2>&1 ||
        fail "$dir: ratemeshd refuses the pods' configuration: $(cat "$work/$name.config")"
    say "ok: $dir: ratemeshd accepts the ConfigMap's ratemesh.toml with the pods' variables ($(tail -n 1 "$work/$name.config"))"
done

# The Envoy Gateway overlay: Envoy Gateway's configuration with the ratelimit Deployment
# overridden, the pods' headless Service and the cluster secret. Rendered and validated
# strictly; then the Deployment Envoy Gateway would create from it (the override merged into
# its own, see tests/kubernetes_envoy_gateway.py) is validated strictly too, and the
# container's RATEMESH_ variables with `ratemeshd validate` over the image's configuration.
dir=deploy/kubernetes/envoy-gateway
rendered=$work/envoy-gateway.yaml
kubectl kustomize "$dir" >"$rendered" 2>"$work/envoy-gateway.err" ||
    fail "kubectl kustomize $dir: $(cat "$work/envoy-gateway.err")"
"$venv/bin/python" tests/kubernetes_envoy_gateway.py "$rendered" "$work/envoy-gateway-deployment.yaml" \
    "$work/envoy-gateway.env" || fail "$dir: the overlay does not fit Envoy Gateway's contract"
for file in "$rendered" "$work/envoy-gateway-deployment.yaml"; do
    "$venv/bin/kubernetes-validate" --strict -k "$kubernetes_version" "$file" >"$work/envoy-gateway.validate" 2>&1 ||
        fail "kubernetes-validate $file:
$(grep -v '^INFO' "$work/envoy-gateway.validate")"
    ! grep -q 'Couldn.t find schema' "$work/envoy-gateway.validate" ||
        fail "$file: objects without a schema: $(cat "$work/envoy-gateway.validate")"
done
mapfile -t pod_env <"$work/envoy-gateway.env"
env -i "${pod_env[@]}" "$binary" validate --config deploy/docker/ratemesh.toml >"$work/envoy-gateway.config" 2>&1 ||
    fail "$dir: ratemeshd refuses the override's variables: $(cat "$work/envoy-gateway.config")"
say "ok: $dir: renders, valid (strict) with the ratelimit Deployment it makes, variables accepted"

# 6. The alerting rules (deploy/prometheus): promtool's check and unit tests, series exported.
bash tests/prometheus_rules.sh || fail "deploy/prometheus: the alerting rules"
say "PASS"
