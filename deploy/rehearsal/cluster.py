"""What the API server and the controllers would make of the rendered objects: pods of the
StatefulSets (name-<ordinal>, with the pod-name and pod-index labels) and Deployments
(name-<template hash>-<random>), the names Services resolve to, and each container's
environment ($(VAR) references, fieldRef, resourceFieldRef, configMapKeyRef) and volume files
(ConfigMap and Secret keys written as files, emptyDirs, one directory per PersistentVolumeClaim),
all from the manifests as rendered, nothing added.
"""
import base64
import hashlib
import json
import math
import os
import random
import re


def load_objects(rendered_json):
    objects = json.loads(rendered_json)
    index = {}
    for o in objects:
        index[(o["kind"], o["metadata"]["name"])] = o
    return objects, index


def template_hash(template):
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def pod_from(workload, ordinal=None):
    """A pod object for `workload` (a StatefulSet's ordinal, or a Deployment's next replica)."""
    template = workload["spec"]["template"]
    labels = dict(template["metadata"].get("labels", {}))
    base = workload["metadata"]["name"]
    if workload["kind"] == "StatefulSet":
        name = "%s-%d" % (base, ordinal)
        labels["statefulset.kubernetes.io/pod-name"] = name
        labels["apps.kubernetes.io/pod-index"] = str(ordinal)
        labels["controller-revision-hash"] = "%s-%s" % (base, template_hash(template))
    else:
        pod_hash = template_hash(template)
        suffix = "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        name = "%s-%s-%s" % (base, pod_hash, suffix)
        labels["pod-template-hash"] = pod_hash
    return {"metadata": {"name": name, "namespace": workload["metadata"].get("namespace", "default"),
                         "labels": labels, "owner": base},
            "spec": template["spec"]}


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def service_names(service, namespace):
    name = service["metadata"]["name"]
    return [name, "%s.%s" % (name, namespace), "%s.%s.svc" % (name, namespace),
            "%s.%s.svc.cluster.local" % (name, namespace)]


def dns_names(objects, pods):
    """{name: pod IP} of every Service (a ClusterIP Service answers with its one pod's IP: the
    rehearsal has no virtual IPs, so a Service must select at most one pod and its ports must
    equal their target ports) and of every pod of a headless Service (<pod>.<service>...)."""
    names = {}
    for s in (o for o in objects if o["kind"] == "Service"):
        namespace = s["metadata"].get("namespace", "default")
        chosen = [p for p in pods if selects(s["spec"].get("selector"), p["metadata"]["labels"])]
        if s["spec"].get("clusterIP") == "None":
            for p in chosen:
                for svc_name in service_names(s, namespace):
                    names["%s.%s" % (p["metadata"]["name"], svc_name)] = p["ip"]
            continue
        if len(chosen) > 1:
            raise RuntimeError("Service %s selects %d pods; the rehearsal resolves a Service to "
                               "one pod" % (s["metadata"]["name"], len(chosen)))
        for port in s["spec"]["ports"]:
            for p in chosen:
                number = container_port(p, port.get("targetPort", port["port"]))
                if number != port["port"]:
                    raise RuntimeError("Service %s port %s targets %s: the rehearsal needs equal "
                                       "ports" % (s["metadata"]["name"], port["port"], number))
        for p in chosen:
            for svc_name in service_names(s, namespace):
                names[svc_name] = p["ip"]
    return names


def container_port(pod, port):
    if isinstance(port, int):
        return port
    for c in pod["spec"]["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == port:
                return p["containerPort"]
    raise RuntimeError("pod %s has no port named %s" % (pod["metadata"]["name"], port))


def cpu_units(quantity):
    """A CPU quantity ("500m", "2") rounded up to whole cores, as resourceFieldRef does."""
    q = str(quantity)
    value = float(q[:-1]) / 1000 if q.endswith("m") else float(q)
    return str(max(1, math.ceil(value)))


def expand(value, env):
    """Kubernetes' $(VAR) expansion: defined variables are replaced, $$ escapes a $."""
    def one(m):
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$\(|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, value)


def container_env(pod, container, index):
    """The container's environment: the image's, then its env list in order."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOSTNAME": pod["metadata"]["name"], "HOME": "/var/lib/prl"}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        source = e["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            m = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            env[e["name"]] = (pod["metadata"]["labels"][m.group(1)] if m else
                              {"metadata.name": pod["metadata"]["name"],
                               "metadata.namespace": pod["metadata"]["namespace"],
                               "status.podIP": pod["ip"]}[path])
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            owner = next(c for c in pod["spec"]["containers"] if c["name"] == ref.get("containerName", container["name"]))
            kind, resource = ref["resource"].split(".")
            env[e["name"]] = cpu_units(owner["resources"][kind][resource])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[e["name"]] = index[("ConfigMap", ref["name"])]["data"][ref["key"]]
        else:
            raise RuntimeError("env %s: unsupported source %s" % (e["name"], source))
    return env


def secret_data(secret):
    return {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}


def materialize_volumes(pod, index, pod_dir, pvc_dir, uid, gid):
    """Host directories standing for the pod's volumes: {volume name: path}. ConfigMaps and
    Secrets as files (all keys, or the listed items), emptyDirs as directories (medium Memory
    in /dev/shm, which is memory), claims as directories that outlive the pod."""
    paths = {}
    for v in pod["spec"].get("volumes", []):
        name = v["name"]
        if "configMap" in v or "secret" in v:
            if "configMap" in v:
                obj = index.get(("ConfigMap", v["configMap"]["name"]))
                data = {k: s.encode() for k, s in (obj or {}).get("data", {}).items()}
                spec = v["configMap"]
            else:
                obj = index.get(("Secret", v["secret"]["secretName"]))
                data = secret_data(obj) if obj else {}
                spec = v["secret"]
            if obj is None and not spec.get("optional"):
                raise RuntimeError("pod %s: volume %s names a missing object" % (pod["metadata"]["name"], name))
            items = spec.get("items") or [{"key": k, "path": k} for k in data]
            path = os.path.join(pod_dir, "volumes", name)
            os.makedirs(path, exist_ok=True)
            for item in items:
                target = os.path.join(path, item["path"])
                with open(target, "wb") as f:
                    f.write(data[item["key"]])
                os.chmod(target, spec.get("defaultMode", 0o644))
                os.chown(target, 0, gid)
        elif "emptyDir" in v:
            if v["emptyDir"].get("medium") == "Memory":
                path = os.path.join(pod["shm_root"], "volume-" + name)
            else:
                path = os.path.join(pod_dir, "volumes", name)
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
        elif "persistentVolumeClaim" in v:
            path = os.path.join(pvc_dir, v["persistentVolumeClaim"]["claimName"])
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
        else:
            raise RuntimeError("volume %s: unsupported source" % name)
        paths[name] = path
    return paths

