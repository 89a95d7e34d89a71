#!/usr/bin/env python3
"""Holds Kubernetes manifests to the daemon they run.

    check_manifests.py --daemon PATH/backhauld MANIFEST-OR-DIRECTORY...

Loads every YAML document of every manifest (a directory: its *.yaml and *.yml files) and, for each
container that runs the backhauld image (the image's name is `backhauld`), checks:
  - every BACKHAUL_* variable it gets (its `env`, and the keys of the Secrets and ConfigMaps its
    `envFrom` names) is one that `backhauld --help` lists;
  - every probe (httpGet, or the URL an exec probe curls) asks /healthz or /readyz, on the port
    BACKHAUL_LISTEN gives, and an httpGet reaches a loopback daemon only from the host network;
  - its declared ports and the Services that select its pods reach that port (and no Service
    selects a daemon on loopback);
  - a listen address beyond loopback comes with BACKHAUL_TOKENS, each entry `TOKEN admin` or
    `TOKEN client PATTERN...`;
  - every BACKHAUL_SHARED_ROOTS entry is inside a BACKHAUL_ALLOWED_ROOTS entry and is the mount
    path of a volume whose PersistentVolumeClaim (in the manifests) is ReadWriteMany;
  - BACKHAUL_STATE_URL starts with postgres://;
  - its image's tag is the version `backhauld --version` prints;
  - every BACKHAUL_ALLOWED_ROOTS entry that is a volume's mount path is mounted writable: the
    daemon removes files there (`delete_file_on_success`) and writes downloads there.
Prints what it checked, and every violation; exits 1 when there is one, 2 when it cannot run.
"""

import argparse
import base64
import ipaddress
import os
import re
import subprocess
import sys

import yaml

PROBE_PATHS = {"/healthz", "/readyz"}
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
# The daemon's default, and the image's (Deploy/Dockerfile).
DEFAULT_LISTEN = "127.0.0.1:8427"
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}


def die(message):
    print(f"check_manifests: {message}", file=sys.stderr)
    sys.exit(2)


def daemon_variables(binary):
    """The BACKHAUL_* names `backhauld --help` prints."""
    try:
        result = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        die(f"cannot run {binary} --help: {error}")
    names = set(re.findall(r"BACKHAUL_[A-Z_]+", result.stdout + result.stderr))
    if "BACKHAUL_LISTEN" not in names:
        die(f"{binary} --help lists no BACKHAUL_LISTEN (exit {result.returncode}); is it backhauld?")
    return names


def daemon_version(binary):
    """The version `backhauld --version` prints (`backhauld 0.2.0`)."""
    try:
        result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        die(f"cannot run {binary} --version: {error}")
    words = result.stdout.split()
    if len(words) < 2:
        die(f"{binary} --version printed {result.stdout!r}")
    return words[-1]


def manifest_files(arguments):
    files = []
    for argument in arguments:
        if os.path.isdir(argument):
            files += sorted(
                os.path.join(argument, name) for name in os.listdir(argument) if name.endswith((".yaml", ".yml"))
            )
        else:
            files.append(argument)
    return files


def load_documents(files):
    """(file, document) for every non-empty document."""
    documents = []
    for path in files:
        with open(path, encoding="utf-8") as stream:
            try:
                documents += [(path, document) for document in yaml.safe_load_all(stream) if document]
            except yaml.YAMLError as error:
                die(f"{path} is not YAML: {error}")
    return documents


def namespace_of(document):
    return (document.get("metadata") or {}).get("namespace", "default")


def name_of(document):
    return (document.get("metadata") or {}).get("name", "?")


def is_daemon(container):
    """A container of the backhauld image: its last path component, without tag or digest."""
    image = container.get("image", "")
    return re.split(r"[:@]", image.rsplit("/", 1)[-1])[0] == "backhauld"


def pod_template(document):
    if document.get("kind") == "Pod":
        return document
    if document.get("kind") in WORKLOAD_KINDS:
        return (document.get("spec") or {}).get("template")
    if document.get("kind") == "CronJob":
        return ((document.get("spec") or {}).get("jobTemplate") or {}).get("spec", {}).get("template")
    return None


def source_keys(source):
    """The keys of a Secret or ConfigMap, with their text (Secret `data` is base64)."""
    keys = dict((source.get("stringData") or {}).items())
    for key, value in (source.get("data") or {}).items():
        if source.get("kind") == "Secret":
            try:
                keys[key] = base64.b64decode(value).decode("utf-8")
            except ValueError:
                keys[key] = None
        else:
            keys[key] = value
    return keys


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_listen(listen):
    host, _, port = listen.rpartition(":")
    return host, port


def inside(path, root):
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


class Checker:
    def __init__(self, variables, documents, version):
        self.variables = variables
        self.version = version
        self.documents = documents
        self.violations = []
        self.counts = {"files": len({path for path, _ in documents}), "documents": len(documents), "containers": 0,
                       "variables": 0, "probes": 0, "ports": 0, "services": 0, "shared roots": 0, "state urls": 0, "images": 0,
                       "writable roots": 0}
        self.sources = {}
        self.claims = {}
        for _, document in documents:
            kind = document.get("kind")
            if kind in ("Secret", "ConfigMap"):
                self.sources[(kind, namespace_of(document), name_of(document))] = source_keys(document)
            elif kind == "PersistentVolumeClaim":
                modes = (document.get("spec") or {}).get("accessModes") or []
                self.claims[(namespace_of(document), name_of(document))] = modes

    def fail(self, where, message):
        self.violations.append(f"{where}: {message}")

    def run(self):
        for path, document in self.documents:
            template = pod_template(document)
            if not template:
                continue
            spec = template.get("spec") or {}
            for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
                if is_daemon(container):
                    where = f"{path}: {document.get('kind')} {name_of(document)}, container {container.get('name')}"
                    self.check_container(where, document, template, spec, container)

    def environment(self, where, namespace, container):
        """The container's variables, name -> text (None when the text is not in the manifests)."""
        variables = {}
        for source in container.get("envFrom") or []:
            for kind, field in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                if field not in source:
                    continue
                reference = source[field].get("name")
                keys = self.sources.get((kind, namespace, reference))
                if keys is None:
                    if not source[field].get("optional"):
                        self.fail(where, f"envFrom names {kind} {reference}, which no manifest holds")
                    continue
                prefix = source.get("prefix", "")
                variables.update({prefix + key: value for key, value in keys.items()})
        for entry in container.get("env") or []:
            value = entry.get("value")
            reference = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if reference:
                value = (self.sources.get(("Secret", namespace, reference.get("name"))) or {}).get(reference.get("key"))
            elif "valueFrom" in entry:
                value = None
            variables[entry.get("name", "")] = value
        return variables

    def check_container(self, where, document, template, spec, container):
        self.counts["containers"] += 1
        namespace = namespace_of(document)
        variables = self.environment(where, namespace, container)

        for name in sorted(variables):
            if name.startswith("BACKHAUL_"):
                self.counts["variables"] += 1
                if name not in self.variables:
                    self.fail(where, f"{name} is not a variable of backhauld (backhauld --help lists none by that name)")

        listen = variables.get("BACKHAUL_LISTEN") or DEFAULT_LISTEN
        host, port = split_listen(listen)
        if not port.isdigit():
            self.fail(where, f"BACKHAUL_LISTEN {listen!r} has no numeric port")
            return
        port = int(port)
        host_network = spec.get("hostNetwork", False)

        named_ports = {}
        for declared in container.get("ports") or []:
            self.counts["ports"] += 1
            named_ports[declared.get("name")] = declared.get("containerPort")
            if declared.get("containerPort") != port:
                self.fail(where, f"containerPort {declared.get('containerPort')} is not BACKHAUL_LISTEN's port {port}")

        def resolve(value):
            return named_ports.get(value) if isinstance(value, str) else value

        for probe_name in PROBES:
            probe = container.get(probe_name) or {}
            if "httpGet" in probe:
                request = probe["httpGet"]
                self.check_probe(where, probe_name, request.get("path"), resolve(request.get("port")), port)
                # The kubelet sends it from the node to the pod's address: a daemon on loopback is
                # reachable only with the host's network and a probe that names loopback.
                if is_loopback(host) and not (host_network and is_loopback(request.get("host", ""))):
                    self.fail(where, f"{probe_name} is sent to the pod's address, but the daemon listens on {host}")
            elif "exec" in probe:
                # A command run inside the container (curl beside a loopback daemon): its URL.
                for argument in (probe["exec"] or {}).get("command") or []:
                    for url in re.finditer(r"https?://([^/\s\"']+)(/[^\s\"']*)?", str(argument)):
                        _, url_port = split_listen(url.group(1))
                        url_port = int(url_port) if url_port.isdigit() else 80
                        self.check_probe(where, probe_name, url.group(2), url_port, port)

        self.check_services(where, namespace, template, port, named_ports, host)

        if not is_loopback(host):
            tokens = variables.get("BACKHAUL_TOKENS")
            if "BACKHAUL_TOKENS" not in variables and "--token-file" not in (container.get("args") or []):
                self.fail(where, f"listens on {listen} beyond loopback without BACKHAUL_TOKENS (the daemon refuses to start)")
            elif tokens is not None:
                self.check_tokens(where, tokens)

        self.check_shared_roots(where, namespace, spec, container, variables)
        self.check_image(where, container)
        self.check_writable_roots(where, container, variables)

        if "BACKHAUL_STATE_URL" in variables:
            self.counts["state urls"] += 1
            url = variables["BACKHAUL_STATE_URL"]
            if url is not None and not url.startswith("postgres://"):
                self.fail(where, f"BACKHAUL_STATE_URL {url!r} does not start with postgres://")

    def check_probe(self, where, probe_name, path, probe_port, port):
        self.counts["probes"] += 1
        if path not in PROBE_PATHS:
            self.fail(where, f"{probe_name} asks {path}, not one of {sorted(PROBE_PATHS)}")
        if probe_port != port:
            self.fail(where, f"{probe_name} asks port {probe_port}, not BACKHAUL_LISTEN's port {port}")

    def check_services(self, where, namespace, template, port, named_ports, host):
        labels = (template.get("metadata") or {}).get("labels") or {}
        for _, document in self.documents:
            if document.get("kind") != "Service" or namespace_of(document) != namespace:
                continue
            selector = (document.get("spec") or {}).get("selector") or {}
            if not selector or any(labels.get(key) != value for key, value in selector.items()):
                continue
            self.counts["services"] += 1
            if is_loopback(host):
                self.fail(where, f"Service {name_of(document)} selects a daemon that listens on loopback only")
            for service_port in (document.get("spec") or {}).get("ports") or []:
                target = service_port.get("targetPort", service_port.get("port"))
                if (named_ports.get(target) if isinstance(target, str) else target) != port:
                    self.fail(where, f"Service {name_of(document)} sends to {target}, not BACKHAUL_LISTEN's port {port}")

    def check_tokens(self, where, tokens):
        for number, entry in enumerate(filter(str.strip, tokens.replace("\n", ";").split(";")), 1):
            fields = entry.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) < 2 or fields[1] not in ("admin", "client") or (fields[1] == "admin") != (len(fields) == 2):
                self.fail(where, f"BACKHAUL_TOKENS entry {number} is not `TOKEN admin` or `TOKEN client PATTERN...`")
            elif len(fields[0]) < 16:
                self.fail(where, f"BACKHAUL_TOKENS entry {number}: tokens must be at least 16 characters")

    def check_shared_roots(self, where, namespace, spec, container, variables):
        shared = [root for root in (variables.get("BACKHAUL_SHARED_ROOTS") or "").split(":") if root]
        arguments = container.get("args") or []
        shared += [arguments[index + 1] for index, argument in enumerate(arguments[:-1]) if argument == "--shared-root"]
        if not shared:
            return
        allowed = [root for root in (variables.get("BACKHAUL_ALLOWED_ROOTS") or "").split(":") if root]
        volumes = {volume.get("name"): volume for volume in spec.get("volumes") or []}
        mounts = {mount.get("mountPath"): mount.get("name") for mount in container.get("volumeMounts") or []}
        for root in shared:
            self.counts["shared roots"] += 1
            if not any(inside(root, allowed_root) for allowed_root in allowed):
                self.fail(where, f"shared root {root} is inside no BACKHAUL_ALLOWED_ROOTS entry ({allowed or 'none set'})")
            volume_name = mounts.get(root) or mounts.get(root.rstrip("/"))
            if volume_name is None:
                self.fail(where, f"shared root {root} is the mount path of no volume")
                continue
            claim = (volumes.get(volume_name) or {}).get("persistentVolumeClaim", {}).get("claimName")
            if claim is None:
                self.fail(where, f"shared root {root} is volume {volume_name}, which is not a PersistentVolumeClaim")
                continue
            modes = self.claims.get((namespace, claim))
            if modes is None:
                self.fail(where, f"shared root {root} is claim {claim}, which no manifest holds")
            elif "ReadWriteMany" not in modes:
                self.fail(where, f"shared root {root} is claim {claim}, which is {modes}, not ReadWriteMany")


    def check_image(self, where, container):
        self.counts["images"] += 1
        image = container.get("image", "")
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else None
        if tag != self.version:
            self.fail(where, f"image {image} is not tagged with the daemon's version {self.version}")

    def check_writable_roots(self, where, container, variables):
        allowed = [root for root in (variables.get("BACKHAUL_ALLOWED_ROOTS") or "").split(":") if root]
        mounts = {mount.get("mountPath", "").rstrip("/"): mount for mount in container.get("volumeMounts") or []}
        for root in allowed:
            mount = mounts.get(root.rstrip("/"))
            if mount is None:
                continue
            self.counts["writable roots"] += 1
            if mount.get("readOnly"):
                self.fail(where, f"allowed root {root} is mounted read-only: delete_file_on_success and downloads cannot work there")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--daemon", required=True, help="the backhauld binary whose --help lists its variables")
    parser.add_argument("manifests", nargs="+", help="manifest files or directories of them")
    arguments = parser.parse_args()

    variables = daemon_variables(arguments.daemon)
    files = manifest_files(arguments.manifests)
    if not files:
        die("no manifests found")
    checker = Checker(variables, load_documents(files), daemon_version(arguments.daemon))
    checker.run()
    print("checked " + ", ".join(f"{count} {what}" for what, count in checker.counts.items())
          + f" (against {len(variables)} variables of backhauld)")
    if checker.counts["containers"] == 0:
        checker.violations.append("no container runs the backhauld image")
    for violation in checker.violations:
        print(f"violation: {violation}")
    sys.exit(1 if checker.violations else 0)


if __name__ == "__main__":
    main()
