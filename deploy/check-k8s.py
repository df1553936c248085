#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/k8s/ offline.

usage: deploy/check-k8s.py [--switchboard BIN]

Every document of every deploy/k8s/*.yaml is validated, strictly (unknown fields fail), with
kubernetes-validate's schemas for each Kubernetes version from MIN_VERSION to the newest it
carries. A kind it has no schema for fails the check, except ServiceMonitor (the Prometheus
Operator's CRD, which kubernetes-validate does not carry): that one is validated against
SERVICE_MONITOR below, a closed schema of the fields the file uses, written from the
operator's API reference (monitoring.coreos.com/v1); a field outside it fails and is to be
added there with its type. Then the manifests are checked against each other (the Service,
PodDisruptionBudget and ServiceMonitor select the Deployment's pods, named ports exist, the
ConfigMap the Deployment mounts holds routes.toml), and with --switchboard the ConfigMap's
routes.toml is validated by `switchboard check`.

Needs: kubernetes-validate (which brings jsonschema and PyYAML); .ci/run installs the pinned
versions of .ci/requirements-k8s.txt into a venv of its own.
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, all_versions

K8S = Path(__file__).resolve().parent / "k8s"
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


def documents():
    for path in sorted(K8S.glob("*.yaml")):
        with path.open() as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    yield path.name, doc


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


def by_kind(docs, kind):
    found = [doc for _, doc in docs if doc.get("kind") == kind]
    if len(found) != 1:
        raise SystemExit(f"check-k8s: FAIL: expected one {kind}, found {len(found)}")
    return found[0]


def cross_check(docs):
    """The objects refer to each other correctly; returns the ConfigMap's routes.toml."""
    errors = []
    deploy = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if deploy["spec"]["selector"]["matchLabels"].items() - labels.items():
        errors.append("Deployment: its selector does not match its pod template's labels")
    container = pod["spec"]["containers"][0]
    ports = {p["name"] for p in container.get("ports", [])}
    for kind, selector in [
        ("Service", by_kind(docs, "Service")["spec"]["selector"]),
        ("PodDisruptionBudget", by_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]),
    ]:
        if selector.items() - labels.items():
            errors.append(f"{kind}: selector {selector} does not select the Deployment's pods")
    service = by_kind(docs, "Service")
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
    return errors, config.get("data", {}).get("routes.toml", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switchboard", help="the binary whose `check` validates routes.toml")
    args = ap.parse_args()
    docs = list(documents())
    if not docs:
        raise SystemExit(f"check-k8s: FAIL: no manifests in {K8S}")
    print(f"== schemas ({len(docs)} objects, kubernetes-validate {kubernetes_validate.__version__})")
    errors = validate_schemas(docs)
    print("== the objects refer to each other")
    more, routes = cross_check(docs)
    errors += more
    if args.switchboard and routes:
        print("== switchboard check of the ConfigMap's routes.toml")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "routes.toml"
            path.write_text(routes)
            run = subprocess.run([args.switchboard, "check", "--config", str(path)],
                                 capture_output=True, text=True)
            sys.stdout.write("   " + run.stdout.replace(tmp + "/", ""))
            if run.returncode != 0:
                errors.append(f"ConfigMap routes.toml: switchboard check failed:\n{run.stderr}")
    if errors:
        for e in errors:
            print(f"check-k8s: FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    print("check-k8s: all checks passed")


if __name__ == "__main__":
    main()
