#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/k8s/ offline.

usage: deploy/check-k8s.py [--switchboard BIN]

Two sets are checked: deploy/k8s/*.yaml, and the variant with a shared store, which is
deploy/k8s/shared/*.yaml in place of the files of the same name plus the rest of
deploy/k8s/ (the ConfigMap, Service and ServiceMonitor). Every document of every file is
validated, strictly (unknown fields fail), with
kubernetes-validate's schemas for each Kubernetes version from MIN_VERSION to the newest it
carries. A kind it has no schema for fails the check, except ServiceMonitor (the Prometheus
Operator's CRD, which kubernetes-validate does not carry): that one is validated against
SERVICE_MONITOR below, a closed schema of the fields the file uses, written from the
operator's API reference (monitoring.coreos.com/v1); a field outside it fails and is to be
added there with its type. Then the manifests are checked against each other (the Service,
PodDisruptionBudget and ServiceMonitor select the Deployment's pods, named ports exist, the
ConfigMap the Deployment mounts holds routes.toml), and with --switchboard the ConfigMap's
routes.toml is validated by `switchboard check` (with the Deployment's SWITCHBOARD_SERVER__*
variables set, as the pods see it). The variant also has: its Deployment the same as the
plain one but for the store's and the ledger's addresses and the spread constraints; the
store's address the Redis Service's name and port; that Service selecting the Redis pods;
the ledger's URL naming the PostgreSQL Service, port, user, database and password variable
(from the server's Secret, set before the URL); that Service selecting its pods; every spread
constraint selecting the Switchboard pods; a PodDisruptionBudget that lets a drain take a
replica and keeps one serving.

Needs: kubernetes-validate (which brings jsonschema and PyYAML); .ci/run installs the pinned
versions of .ci/requirements-k8s.txt into a venv of its own.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, all_versions

K8S = Path(__file__).resolve().parent / "k8s"
SHARED = K8S / "shared"
SHARED_ENV = "SWITCHBOARD_SERVER__SHARED_STATE"
LEDGER_ENV = "SWITCHBOARD_LEDGER__URL"
LEDGER_PASSWORD = "SWITCHBOARD_LEDGER_PASSWORD"
MIN_VERSION = (1, 25)

DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": STRING_MAP,
                "annotations": STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": STRING_MAP},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def load(path, name):
    with path.open() as f:
        return [(name, doc) for doc in yaml.safe_load_all(f) if doc is not None]


def documents():
    """The plain set: every object of deploy/k8s/*.yaml."""
    return [d for path in sorted(K8S.glob("*.yaml")) for d in load(path, path.name)]


def variant_documents():
    """The shared-store variant: deploy/k8s/shared/*.yaml, and the plain files it does not
    replace."""
    own = {p.name: p for p in SHARED.glob("*.yaml")}
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name not in own:
            docs += load(path, path.name)
    for name, path in sorted(own.items()):
        docs += load(path, f"shared/{name}")
    return docs


def versions():
    seen = []
    for v in all_versions():
        major, minor = (int(x) for x in v.split(".")[:2])
        if (major, minor) >= MIN_VERSION and v not in seen:
            seen.append(v)
    return seen


def validate_schemas(docs):
    errors = []
    vs = versions()
    for name, doc in docs:
        kind = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        before = len(errors)
        if doc.get("kind") == "ServiceMonitor":
            for e in jsonschema.Draft7Validator(SERVICE_MONITOR).iter_errors(doc):
                errors.append(f"{name}: {kind}: {'.'.join(map(str, e.path))}: {e.message}")
            if len(errors) == before:
                print(f"   {name}: {kind} valid against the ServiceMonitor schema of this script")
            continue
        failures = {}  # message -> the versions it fails for
        for v in vs:
            try:
                kubernetes_validate.validate(doc, v, strict=True)
            except SchemaNotFoundError:
                api = doc.get("apiVersion")
                errors.append(f"{name}: {kind}: kubernetes-validate has no schema for {api}")
                break
            except kubernetes_validate.ValidationError as e:
                message = f"{'.'.join(map(str, e.path))}: {e.message}"
                failures.setdefault(message, []).append(v)
        for message, failed in failures.items():
            span = failed[0] if len(failed) == 1 else f"{failed[0]} to {failed[-1]}"
            errors.append(f"{name}: {kind}: Kubernetes {span}: {message}")
        if len(errors) == before:
            print(f"   {name}: {kind} valid for Kubernetes {vs[0]} to {vs[-1]}")
    return errors


def by_kind(docs, kind, name=None):
    found = [doc for _, doc in docs if doc.get("kind") == kind
             and (name is None or doc["metadata"]["name"] == name)]
    if len(found) != 1:
        raise SystemExit(f"check-k8s: FAIL: expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def without_variant(deploy):
    """A Deployment without what the variant may change: the store's and the ledger's
    addresses and the spread constraints."""
    d = yaml.safe_load(yaml.safe_dump(deploy))
    spec = d["spec"]["template"]["spec"]
    spec.pop("topologySpreadConstraints", None)
    for c in spec["containers"]:
        c["env"] = [e for e in c.get("env", [])
                    if e["name"] not in (SHARED_ENV, LEDGER_ENV, LEDGER_PASSWORD)]
    return d


def check_variant(docs, plain):
    """What the shared-store variant must keep besides what every set keeps."""
    errors = []
    deploy = by_kind(docs, "Deployment", "switchboard")
    if without_variant(deploy) != without_variant(by_kind(plain, "Deployment", "switchboard")):
        errors.append("shared/deployment.yaml: differs from deployment.yaml in more than "
                      f"{SHARED_ENV}, {LEDGER_ENV} and topologySpreadConstraints")
    pod = deploy["spec"]["template"]
    labels = pod["metadata"]["labels"]
    url = env_of(pod["spec"]["containers"][0]).get(SHARED_ENV) or ""
    redis = by_kind(docs, "Service", "switchboard-redis")
    ports = {p["port"] for p in redis["spec"]["ports"]}
    hostport = url.removeprefix("redis://").split("/")[0]
    host, _, port = hostport.partition(":")
    if host != redis["metadata"]["name"] or int(port or 6379) not in ports:
        errors.append(f"shared/deployment.yaml: {SHARED_ENV} {url!r} is not the "
                      f"switchboard-redis Service's name and port")
    store = by_kind(docs, "Deployment", "switchboard-redis")
    store_pod = store["spec"]["template"]
    if redis["spec"]["selector"].items() - store_pod["metadata"]["labels"].items():
        errors.append("shared/redis.yaml: the Service does not select the Redis pods")
    store_ports = {p["name"] for p in store_pod["spec"]["containers"][0].get("ports", [])}
    for p in redis["spec"]["ports"]:
        if isinstance(p.get("targetPort"), str) and p["targetPort"] not in store_ports:
            errors.append(f"shared/redis.yaml: targetPort {p['targetPort']} is no port of Redis")
    errors += check_ledger(docs, pod["spec"]["containers"][0])
    spread = pod["spec"].get("topologySpreadConstraints", [])
    if not spread:
        errors.append("shared/deployment.yaml: no topologySpreadConstraints")
    for c in spread:
        if c["labelSelector"]["matchLabels"].items() - labels.items():
            errors.append(f"shared/deployment.yaml: spread over {c['topologyKey']} does not "
                          "select the Deployment's pods")
    replicas = deploy["spec"].get("replicas", 1)
    pdb = by_kind(docs, "PodDisruptionBudget")["spec"]
    if replicas < 2:
        errors.append("shared/deployment.yaml: fewer than two replicas")
    if "minAvailable" in pdb:
        keeps = pdb["minAvailable"]
    else:
        keeps = replicas - pdb.get("maxUnavailable", 0)
    if not 1 <= keeps < replicas:
        errors.append(f"shared/pdb.yaml: keeps {keeps} of {replicas} replicas: a drain must "
                      "be able to take one and leave one serving")
    return errors


def check_ledger(docs, container):
    """The ledger's URL names the PostgreSQL Service, its port and the database the server
    makes, with the password the Secret gives both; the Service selects the server's pods."""
    errors = []
    env = {e["name"]: e for e in container.get("env", [])}
    url = env.get(LEDGER_ENV, {}).get("value") or ""
    pg = by_kind(docs, "StatefulSet", "switchboard-postgres")
    service = by_kind(docs, "Service", "switchboard-postgres")
    server = pg["spec"]["template"]["spec"]["containers"][0]
    server_env = {e["name"]: e for e in server.get("env", [])}
    want = (f"postgres://{server_env['POSTGRES_USER']['value']}:$({LEDGER_PASSWORD})@"
            f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/"
            f"{server_env['POSTGRES_DB']['value']}")
    if url != want:
        errors.append(f"shared/deployment.yaml: {LEDGER_ENV} {url!r} is not {want!r}")
    names = list(env)
    if LEDGER_PASSWORD not in names or names.index(LEDGER_PASSWORD) > names.index(LEDGER_ENV):
        errors.append(f"shared/deployment.yaml: {LEDGER_PASSWORD} must come before "
                      f"{LEDGER_ENV} (Kubernetes expands $(VAR) only from earlier variables)")
    secret = lambda e: e.get("valueFrom", {}).get("secretKeyRef")
    if secret(env.get(LEDGER_PASSWORD, {})) != secret(server_env.get("POSTGRES_PASSWORD", {})):
        errors.append("shared/: the ledger's password and the server's come from different "
                      "Secrets")
    if service["spec"]["selector"].items() - pg["spec"]["template"]["metadata"]["labels"].items():
        errors.append("shared/postgres.yaml: the Service does not select the PostgreSQL pods")
    return errors


def cross_check(docs):
    """The objects refer to each other correctly; returns the ConfigMap's routes.toml."""
    errors = []
    deploy = by_kind(docs, "Deployment", "switchboard")
    pod = deploy["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if deploy["spec"]["selector"]["matchLabels"].items() - labels.items():
        errors.append("Deployment: its selector does not match its pod template's labels")
    container = pod["spec"]["containers"][0]
    ports = {p["name"] for p in container.get("ports", [])}
    for kind, selector in [
        ("Service", by_kind(docs, "Service", "switchboard")["spec"]["selector"]),
        ("PodDisruptionBudget", by_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]),
    ]:
        if selector.items() - labels.items():
            errors.append(f"{kind}: selector {selector} does not select the Deployment's pods")
    service = by_kind(docs, "Service", "switchboard")
    for p in service["spec"]["ports"]:
        if isinstance(p.get("targetPort"), str) and p["targetPort"] not in ports:
            errors.append(f"Service: targetPort {p['targetPort']} is no port of the container")
    monitor = by_kind(docs, "ServiceMonitor")
    if monitor["spec"]["selector"]["matchLabels"].items() - service["metadata"]["labels"].items():
        errors.append("ServiceMonitor: its selector does not select the Service")
    service_ports = {p.get("name") for p in service["spec"]["ports"]}
    for ep in monitor["spec"]["endpoints"]:
        if ep.get("port") not in service_ports:
            errors.append(f"ServiceMonitor: port {ep.get('port')} is no port of the Service")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != "/health" or get.get("port") not in ports:
            errors.append(f"Deployment: {probe} is not an HTTP GET of /health on a named port")
    config = by_kind(docs, "ConfigMap")
    mounted = [v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v]
    if config["metadata"]["name"] not in mounted:
        errors.append("Deployment: does not mount the ConfigMap")
    if any("subPath" in m for m in container.get("volumeMounts", [])):
        errors.append("Deployment: a subPath mount never sees ConfigMap updates")
    if "routes.toml" not in config.get("data", {}):
        errors.append("ConfigMap: has no routes.toml")
    env = {k: v for k, v in env_of(container).items()
           if k.startswith("SWITCHBOARD_SERVER__") and v is not None}
    return errors, config.get("data", {}).get("routes.toml", ""), env


def check_set(title, docs, validated, switchboard):
    """Every check of one set; `validated`: objects whose schemas were checked already."""
    fresh = [(n, d) for n, d in docs if n not in validated]
    print(f"== {title}: schemas ({len(fresh)} objects, kubernetes-validate "
          f"{kubernetes_validate.__version__})")
    errors = validate_schemas(fresh)
    validated.update(n for n, _ in fresh)
    print(f"== {title}: the objects refer to each other")
    more, routes, env = cross_check(docs)
    errors += more
    if switchboard and routes:
        print(f"== {title}: switchboard check of the ConfigMap's routes.toml")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "routes.toml"
            path.write_text(routes)
            # As the pods read it: the Deployment's server settings, not the listen
            # address (a pod's, not this machine's).
            env.pop("SWITCHBOARD_SERVER__LISTEN", None)
            run = subprocess.run([switchboard, "check", "--config", str(path)],
                                 capture_output=True, text=True, env={**os.environ, **env})
            sys.stdout.write("   " + run.stdout.replace(tmp + "/", ""))
            if run.returncode != 0:
                errors.append(f"{title}: ConfigMap routes.toml: switchboard check failed:\n"
                              f"{run.stderr}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switchboard", help="the binary whose `check` validates routes.toml")
    args = ap.parse_args()
    plain = documents()
    if not plain:
        raise SystemExit(f"check-k8s: FAIL: no manifests in {K8S}")
    validated = set()
    errors = check_set("deploy/k8s", plain, validated, args.switchboard)
    shared = variant_documents()
    errors += check_set("deploy/k8s with shared/", shared, validated, args.switchboard)
    print("== deploy/k8s with shared/: the shared store")
    errors += check_variant(shared, plain)
    if errors:
        for e in errors:
            print(f"check-k8s: FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    print("check-k8s: all checks passed")


if __name__ == "__main__":
    main()
