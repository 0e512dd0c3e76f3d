#!/usr/bin/env python3
"""What the Kubernetes schemas cannot see in the Envoy Gateway overlay
(deploy/kubernetes/envoy-gateway; run by tests/kubernetes.sh in its kubernetes-validate venv):

    kubernetes_envoy_gateway.py RENDERED.yaml OUT-deployment.yaml OUT.env

checks that Envoy Gateway's configuration (the ConfigMap envoy-gateway-config) turns global rate
limiting on and overrides the ratelimit Deployment with the ratemeshd image, that the headless
Service selects the label the override puts on the pods and publishes not-ready addresses, that
the seeds name that Service's gossip port and the secret a Secret of the rendering. Then writes
the ratelimit Deployment as Envoy Gateway would create it with the override applied (its
container: /bin/ratelimit, ports 8081 and 8080, the probes on /healthcheck) to
OUT-deployment.yaml, for the strict schema check, and the container's RATEMESH_ variables to
OUT.env for `ratemeshd validate`. Exits 1 listing every problem found.
"""

import sys

import yaml

from kubernetes_check import pod_env, subset


def check(objects, problems):
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    config_map = next((c for c in by_kind.get("ConfigMap", []) if c["metadata"]["name"] == "envoy-gateway-config"), None)
    if config_map is None:
        problems.append("no ConfigMap envoy-gateway-config")
        return None, {}
    eg = yaml.safe_load(config_map["data"]["envoy-gateway.yaml"])
    if (eg.get("apiVersion"), eg.get("kind")) != ("gateway.envoyproxy.io/v1alpha1", "EnvoyGateway"):
        problems.append(f"envoy-gateway.yaml is {eg.get('apiVersion')}/{eg.get('kind')}, not an EnvoyGateway")
    if eg.get("rateLimit", {}).get("backend", {}).get("type") != "Redis":
        problems.append("rateLimit.backend.type must be Redis: Envoy Gateway deploys no rate limit service otherwise")
    override = eg["provider"]["kubernetes"]["rateLimitDeployment"]
    container = override["container"]
    if "ratemeshd" not in container.get("image", ""):
        problems.append(f"the override's image {container.get('image')!r} is not ratemeshd")
    pod_labels = override.get("pod", {}).get("labels", {})
    services = by_kind.get("Service", [])
    peers = [s for s in services if s["spec"].get("clusterIP") == "None"]
    if len(peers) != 1:
        problems.append(f"expected one headless Service, found {len(peers)}")
        return None, {}
    peers = peers[0]
    if not subset(peers["spec"].get("selector", {}), pod_labels):
        problems.append(f"the headless Service selects {peers['spec'].get('selector')}, not the pods' labels {pod_labels}")
    if not peers["spec"].get("publishNotReadyAddresses"):
        problems.append("the headless Service must publish not-ready addresses (pods join before they are ready)")
    gossip = next((p["port"] for p in peers["spec"]["ports"] if p["name"] == "gossip"), None)
    env = {v["name"]: v for v in container.get("env", [])}
    seeds = env.get("RATEMESH_CLUSTER_SEEDS", {}).get("value", "")
    if seeds != f"{peers['metadata']['name']}:{gossip}":
        problems.append(f"RATEMESH_CLUSTER_SEEDS is {seeds!r}, not the headless Service's gossip port")
    secret_ref = env.get("RATEMESH_CLUSTER_SECRET", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if secret_ref.get("name") not in {s["metadata"]["name"] for s in by_kind.get("Secret", [])}:
        problems.append(f"RATEMESH_CLUSTER_SECRET reads Secret {secret_ref.get('name')!r}, which is not in the rendering")
    deployment = ratelimit_deployment(override, container)
    return deployment, pod_env(container, by_kind)


def ratelimit_deployment(override, container):
    """The Deployment Envoy Gateway creates for its rate limit service (its testdata
    deployments/default.yaml, trimmed to what the override touches), the override merged in."""
    labels = {"app.kubernetes.io/name": "envoy-ratelimit", **override.get("pod", {}).get("labels", {})}
    probe = {"httpGet": {"path": "/healthcheck", "port": 8080, "scheme": "HTTP"}}
    eg_env = [
        {"name": "RUNTIME_ROOT", "value": "/data"},
        {"name": "RUNTIME_SUBDIRECTORY", "value": "ratelimit"},
        {"name": "RUNTIME_IGNOREDOTFILES", "value": "true"},
        {"name": "RUNTIME_WATCH_ROOT", "value": "false"},
        {"name": "LOG_LEVEL", "value": "info"},
        {"name": "USE_STATSD", "value": "false"},
        {"name": "CONFIG_TYPE", "value": "GRPC_XDS_SOTW"},
        {"name": "CONFIG_GRPC_XDS_SERVER_URL", "value": "envoy-gateway:18001"},
        {"name": "CONFIG_GRPC_XDS_NODE_ID", "value": "envoy-ratelimit"},
        {"name": "FORCE_START_WITHOUT_INITIAL_CONFIG", "value": "true"},
        {"name": "REDIS_URL", "value": "ratemesh-needs-no-redis.invalid:6379"},
    ]
    merged = {
        "name": "envoy-ratelimit",
        "image": container["image"],
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/ratelimit"],
        "ports": [{"name": "grpc", "containerPort": 8081, "protocol": "TCP"}],
        "env": eg_env + container.get("env", []),
        "resources": container.get("resources", {}),
        "readinessProbe": {**probe, "periodSeconds": 5},
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 30},
        "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "envoy-ratelimit", "namespace": "envoy-gateway-system", "labels": labels},
        "spec": {
            "replicas": override.get("replicas", 1),
            "selector": {"matchLabels": {"app.kubernetes.io/name": "envoy-ratelimit"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 300,
                    "containers": [merged],
                    "volumes": [{"name": "certs", "secret": {"secretName": "envoy-rate-limit"}}],
                },
            },
        },
    }


def main(argv):
    rendered, out_deployment, out_env = argv[1:4]
    with open(rendered) as file:
        objects = [obj for obj in yaml.safe_load_all(file) if obj]
    problems = []
    try:
        deployment, variables = check(objects, problems)
    except (KeyError, IndexError, StopIteration, TypeError, ValueError) as error:
        problems.append(f"unexpected shape: {error!r}")
        deployment, variables = None, {}
    for problem in problems:
        print(f"kubernetes_envoy_gateway: {rendered}: {problem}", file=sys.stderr)
    if problems:
        return 1
    with open(out_deployment, "w") as file:
        yaml.safe_dump(deployment, file)
    with open(out_env, "w") as file:
        file.writelines(f"{name}={value}\n" for name, value in variables.items())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
