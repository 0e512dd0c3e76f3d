#!/usr/bin/env python3
"""What the Kubernetes schemas cannot see in a rendering of deploy/kubernetes (run by
tests/kubernetes.sh, in its kubernetes-validate venv, which has PyYAML):

    kubernetes_check.py RENDERED.yaml ENVOY.yaml OUT.toml OUT.env

checks that the objects fit together (see tests/kubernetes.sh for the list), then writes the
ConfigMap's ratemesh.toml to OUT.toml and the StatefulSet container's RATEMESH_ variables to
OUT.env as NAME=VALUE lines, with values the cluster would fill in replaced by examples (the pod
IP, a Secret the rendering does not hold), for `ratemeshd validate`. Exits 1 listing every
problem found.
"""

import base64
import sys
import tomllib

import yaml

EXAMPLE_POD_IP = "10.0.0.7"
EXAMPLE_SECRET = "an example cluster secret, 32 bytes"


def subset(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check(objects, envoy, problems):
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    statefulsets = by_kind.get("StatefulSet", [])
    if len(statefulsets) != 1:
        problems.append(f"expected one StatefulSet, found {len(statefulsets)}")
        return None, {}
    sts = statefulsets[0]
    spec, pod = sts["spec"], sts["spec"]["template"]
    labels = pod["metadata"].get("labels", {})
    pod_spec = pod["spec"]
    containers = pod_spec["containers"]
    container = containers[0]
    ports = {p["name"]: p for c in containers for p in c.get("ports", [])}

    if spec.get("podManagementPolicy") != "Parallel":
        problems.append("StatefulSet: podManagementPolicy is not Parallel")
    if not subset(spec["selector"].get("matchLabels"), labels):
        problems.append("StatefulSet: its selector does not select its own pods")
    if pod_spec.get("enableServiceLinks") is not False:
        problems.append("pods: enableServiceLinks must be false (Kubernetes would inject RATEMESH_* variables)")

    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    headless = services.get(spec.get("serviceName"))
    if headless is None:
        problems.append(f"StatefulSet: serviceName {spec.get('serviceName')!r} is no Service of the rendering")
    elif headless["spec"].get("clusterIP") != "None" or headless["spec"].get("publishNotReadyAddresses") is not True:
        problems.append("the peers' Service must be headless (clusterIP: None) and publishNotReadyAddresses: true")
    clients = [s for s in services.values() if s is not headless]
    if len(clients) != 1:
        problems.append(f"expected one client Service beside the headless one, found {len(clients)}")
    for name, service in services.items():
        if not subset(service["spec"].get("selector"), labels):
            problems.append(f"Service {name}: its selector does not select the pods")
        for port in service["spec"]["ports"]:
            target = ports.get(port.get("targetPort"))
            if target is None or target.get("protocol", "TCP") != port.get("protocol", "TCP"):
                problems.append(f"Service {name}: port {port['name']} targets no container port of its protocol")
    client_ports = {p["name"] for c in clients for p in c["spec"]["ports"]}
    if not {"http", "grpc"} <= client_ports:
        problems.append(f"the client Service must carry http and grpc, it has {sorted(client_ports)}")

    for pdb in by_kind.get("PodDisruptionBudget", []) or [None]:
        if pdb is None:
            problems.append("no PodDisruptionBudget")
        elif pdb["spec"].get("maxUnavailable") != 1 or not subset(pdb["spec"]["selector"].get("matchLabels"), labels):
            problems.append("PodDisruptionBudget: maxUnavailable must be 1, selecting the pods")
    for policy in by_kind.get("NetworkPolicy", []) or [None]:
        if policy is None:
            problems.append("no NetworkPolicy")
            continue
        if not subset(policy["spec"]["podSelector"].get("matchLabels"), labels):
            problems.append("NetworkPolicy: does not select the pods")
        member_ports = set()
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from", [])
            rule_ports = {(p["port"], p.get("protocol", "TCP")) for p in rule.get("ports", [])}
            if any(port in rule_ports for port in [(7946, "UDP"), (7947, "UDP")]):
                if not peers or not all(subset(p.get("podSelector", {}).get("matchLabels"), labels) for p in peers):
                    problems.append("NetworkPolicy: gossip or QUIC is open to more than the members")
                member_ports |= rule_ports
        if not {(7946, "UDP"), (7947, "UDP")} <= member_ports:
            problems.append("NetworkPolicy: the members cannot reach each other's gossip and QUIC ports")

    probes = {kind: container.get(kind) for kind in ["startupProbe", "livenessProbe", "readinessProbe"]}
    for kind, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")]:
        probe = probes[kind]
        if not probe or probe.get("httpGet", {}).get("path") != path or probe["httpGet"].get("port") not in ports:
            problems.append(f"container: {kind} must GET {path} on a named container port")
    security = container.get("securityContext", {})
    pod_security = pod_spec.get("securityContext", {})
    if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
        problems.append("container: not runAsNonRoot")
    if security.get("readOnlyRootFilesystem") is not True or security.get("allowPrivilegeEscalation") is not False:
        problems.append("container: the root file system must be read-only, privilege escalation off")
    if security.get("capabilities", {}).get("drop") != ["ALL"] or security.get("capabilities", {}).get("add"):
        problems.append("container: capabilities must be dropped (ALL), none added")
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    # The leave itself: about 1 s of gossip rounds, at most 2 s of acknowledgements, the drain.
    if pod_spec.get("terminationGracePeriodSeconds", 30) < pre_stop + 10:
        problems.append("pods: terminationGracePeriodSeconds leaves less than 10 s after preStop for the leave")

    for monitor in by_kind.get("ServiceMonitor", []):
        selector = monitor["spec"].get("selector", {}).get("matchLabels")
        selected = [s for s in services.values() if subset(selector, s["metadata"].get("labels", {}))]
        if [s["metadata"]["name"] for s in selected] != [c["metadata"]["name"] for c in clients]:
            problems.append(f"ServiceMonitor: selects {[s['metadata']['name'] for s in selected]}, not the client Service")
        for endpoint in monitor["spec"].get("endpoints", []):
            if endpoint.get("port") not in client_ports or endpoint.get("path", "/metrics") != "/metrics":
                problems.append(f"ServiceMonitor: endpoint {endpoint} is not the client Service's http /metrics")

    config_text = config_file(container, pod_spec, by_kind, problems)
    check_envoy(envoy, clients, config_text, problems)
    return config_text, pod_env(container, by_kind)


def config_file(container, pod_spec, by_kind, problems):
    """The ratemesh.toml the container's --config names, from the ConfigMap mounted there."""
    args = container.get("args", [])
    path = args[args.index("--config") + 1] if "--config" in args else None
    if path is None:
        problems.append("container: no --config argument")
        return None
    directory, file = path.rsplit("/", 1)
    mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == directory), None)
    if mount is None or "subPath" in mount:
        problems.append(f"container: {directory} must be a whole ConfigMap volume (a subPath never updates)")
        return None
    volume = next((v for v in pod_spec.get("volumes", []) if v["name"] == mount["name"]), {})
    name = volume.get("configMap", {}).get("name")
    config_map = next((c for c in by_kind.get("ConfigMap", []) if c["metadata"]["name"] == name), None)
    if config_map is None or file not in config_map.get("data", {}):
        problems.append(f"the ConfigMap {name!r} mounted at {directory} has no {file}")
        return None
    return config_map["data"][file]


def pod_env(container, by_kind):
    secrets = {s["metadata"]["name"]: s for s in by_kind.get("Secret", [])}
    variables = {}
    for var in container.get("env", []):
        if not var["name"].startswith("RATEMESH_"):
            continue
        if "value" in var:
            variables[var["name"]] = var["value"].replace("$(POD_IP)", EXAMPLE_POD_IP)
            continue
        ref = var.get("valueFrom", {}).get("secretKeyRef", {})
        secret = secrets.get(ref.get("name"))
        if secret is None:
            # The base leaves the Secret to the overlay (or to the operator).
            variables[var["name"]] = EXAMPLE_SECRET
        elif ref.get("key") in secret.get("data", {}):
            variables[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        else:
            variables[var["name"]] = secret.get("stringData", {}).get(ref.get("key"), "")
    return variables


def check_envoy(envoy, clients, config_text, problems):
    """The Envoy example's rate-limit cluster is the client Service's gRPC port, over HTTP/2, and
    its domain is one the policies answer."""
    if not clients:
        return
    service = clients[0]
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    listener = envoy["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    limit_filter = next(f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.ratelimit")
    limit_config = limit_filter["typed_config"]
    cluster_name = limit_config["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    cluster = next((c for c in envoy["static_resources"]["clusters"] if c["name"] == cluster_name), None)
    if cluster is None:
        problems.append(f"envoy: no cluster {cluster_name}")
        return
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    if address["address"].split(".")[0] != service["metadata"]["name"] or address["port_value"] != grpc_port:
        problems.append(f"envoy: the rate-limit cluster is {address}, not Service {service['metadata']['name']}:{grpc_port}")
    options = cluster.get("typed_extension_protocol_options", {}).values()
    if not any("http2_protocol_options" in o.get("explicit_http_config", {}) for o in options):
        problems.append("envoy: the rate-limit cluster must speak HTTP/2 (gRPC)")
    if config_text is not None:
        domains = {p.get("domain") for p in tomllib.loads(config_text).get("policies", [])}
        if limit_config["domain"] not in domains:
            problems.append(f"envoy: domain {limit_config['domain']!r} is in no policy of ratemesh.toml ({domains})")


def main(argv):
    rendered, envoy_path, out_toml, out_env = argv[1:5]
    with open(rendered) as file:
        objects = [obj for obj in yaml.safe_load_all(file) if obj]
    with open(envoy_path) as file:
        envoy = yaml.safe_load(file)
    problems = []
    try:
        config_text, variables = check(objects, envoy, problems)
    except (KeyError, IndexError, StopIteration, TypeError, ValueError) as error:
        problems.append(f"unexpected shape: {error!r}")
        config_text, variables = None, {}
    for problem in problems:
        print(f"kubernetes_check: {rendered}: {problem}", file=sys.stderr)
    if problems:
        return 1
    with open(out_toml, "w") as file:
        file.write(config_text)
    with open(out_env, "w") as file:
        file.writelines(f"{name}={value}\n" for name, value in variables.items())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
