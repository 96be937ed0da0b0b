"""The rehearsal's kubelet: runs a pod's containers as processes the way a container runtime
would, from the pod spec alone, and acts on their probes.

Each container runs in its pod's network namespace (network.py) and in a mount and UTS
namespace of its own (hostname: the pod's name), chrooted into an overlay of the host's root
that is remounted read-only when readOnlyRootFilesystem says so, with:
  - the image's binary at /usr/local/bin/prl (the build's prl: deploy/docker/Dockerfile
    installs it there) and the host's libraries (the runtime packages) below it;
  - every volumeMount bound at its mountPath (read-only where it says), the pod's own
    /dev/shm (a directory of the host's /dev/shm: memory, shared by the pod's containers
    only), the pod's hosts file at /etc/hosts and an empty resolv.conf;
  - the pod's runAsUser/runAsGroup, no new privileges and no capabilities (setpriv);
  - exactly the command, args, env and workingDir of the manifest ($(VAR) expanded).
Init containers run first, in order, each to success. Probes are HTTP GETs from the host to
the pod IP, at the manifest's periods and thresholds: readiness gates the pod's Ready state;
liveness failures, like an exit, restart the container (SIGTERM, the grace period, SIGKILL)
with the kubelet's back-off (10 s doubling). Deleting a pod sends SIGTERM to every container
and SIGKILL after terminationGracePeriodSeconds. Not emulated: cgroup limits (requests and
limits set OMP_NUM_THREADS through the env only), NetworkPolicies, Service virtual IPs.
"""
import os
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import cluster


def http_ok(url, timeout_s):
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return 200 <= r.status < 400
    except (urllib.error.URLError, OSError):
        return False


class Container:
    def __init__(self, pod, spec, init):
        self.pod, self.spec, self.init = pod, spec, init
        self.name = spec["name"]
        self.proc = None
        self.restarts = 0
        self.ready = False
        self.started_at = 0.0
        self.next_start = 0.0
        self.failures = {"readiness": 0, "liveness": 0}
        self.next_probe = {"readiness": 0.0, "liveness": 0.0}
        self.log_path = os.path.join(pod.dir, "%s.log" % self.name)

    def script(self):
        """The shell script that starts the container; kept in the pod's directory."""
        pod, spec = self.pod, self.spec
        security = dict(pod.spec.get("securityContext", {}), **spec.get("securityContext", {}))
        uid, gid = security.get("runAsUser", 0), security.get("runAsGroup", 0)
        root = os.path.join(pod.dir, "rootfs", self.name)
        for d in ("upper", "work", "merged"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        r = os.path.join(root, "merged")
        q = shlex.quote
        lines = ["set -euo pipefail", "R=%s" % q(r),
                 "mount -t overlay overlay -o lowerdir=/,upperdir=%s,workdir=%s \"$R\"" %
                 (q(os.path.join(root, "upper")), q(os.path.join(root, "work"))),
                 'mount --rbind /dev "$R/dev"', 'mount -t proc proc "$R/proc"',
                 'mount --rbind /sys "$R/sys"',
                 'mkdir -p "$R/usr/local/bin" && touch "$R/usr/local/bin/prl"',
                 'mount --bind %s "$R/usr/local/bin/prl"' % q(pod.kubelet.prl),
                 'mount --bind %s "$R/dev/shm"' % q(pod.shm_root),
                 'mount --bind %s "$R/etc/hosts"' % q(pod.hosts_file),
                 'mount --bind %s "$R/etc/resolv.conf"' % q(pod.resolv_file)]
        for m in spec.get("volumeMounts", []):
            src = pod.volumes[m["name"]]
            lines.append('mkdir -p "$R"%s && mount --bind %s "$R"%s' % (q(m["mountPath"]), q(src), q(m["mountPath"])))
            if m.get("readOnly"):
                lines.append('mount -o remount,bind,ro "$R"%s' % q(m["mountPath"]))
        lines.append("hostname %s" % q(pod.name))
        if security.get("readOnlyRootFilesystem"):
            lines.append('mount -o remount,bind,ro "$R"')
        env = cluster.container_env(pod.obj, spec, pod.kubelet.index)
        argv = [cluster.expand(a, env) for a in spec.get("command", []) + spec.get("args", [])]
        priv = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups"]
        if security.get("allowPrivilegeEscalation") is False:
            priv.append("--no-new-privs")
        if "ALL" in security.get("capabilities", {}).get("drop", []):
            priv += ["--inh-caps=-all", "--bounding-set=-all"]
        workdir = spec.get("workingDir", "/")
        lines.append('exec chroot "$R" %s env -i -C %s %s %s' % (
            " ".join(map(q, priv)), q(workdir),
            " ".join(q("%s=%s" % kv) for kv in env.items()), " ".join(map(q, argv))))
        path = os.path.join(pod.dir, "%s.start.sh" % self.name)
        with open(path, "w") as f:
            f.write("#!/bin/bash\n# %s/%s as the manifest gives it\n%s\n" % (pod.name, self.name, "\n".join(lines)))
        return path

    def start(self):
        script = self.script()
        log = open(self.log_path, "a")
        log.write("--- start %d at %.1f\n" % (self.restarts, time.time()))
        log.flush()
        self.proc = subprocess.Popen(
            ["nsenter", "--net=/run/netns/%s" % self.pod.netns, "unshare", "--mount", "--uts",
             "--propagation", "private", "bash", script],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.started_at = time.time()
        self.ready = "readinessProbe" not in self.spec
        self.failures = {"readiness": 0, "liveness": 0}
        delay = {k: self.spec.get(k + "Probe", {}).get("initialDelaySeconds", 0) for k in self.failures}
        self.next_probe = {k: self.started_at + delay[k] for k in self.failures}

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s):
        if not self.running():
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def probe(self, kind, now):
        """Runs the probe when due; True when a liveness failure means a restart."""
        spec = self.spec.get(kind + "Probe")
        if spec is None or now < self.next_probe[kind]:
            return False
        self.next_probe[kind] = now + spec.get("periodSeconds", 10)
        get = spec["httpGet"]
        port = cluster.container_port(self.pod.obj, get["port"])
        ok = http_ok("http://%s:%d%s" % (self.pod.ip, port, get["path"]), spec.get("timeoutSeconds", 1))
        self.failures[kind] = 0 if ok else self.failures[kind] + 1
        threshold = spec.get("failureThreshold", 3)
        if kind == "readiness":
            if ok:
                self.ready = True
            elif self.failures[kind] >= threshold:
                self.ready = False
            return False
        return self.failures[kind] >= threshold


class Pod:
    def __init__(self, kubelet, obj):
        self.kubelet, self.obj = kubelet, obj
        self.name = obj["metadata"]["name"]
        self.spec = obj["spec"]
        self.dir = os.path.join(kubelet.work, "pods", self.name)
        os.makedirs(self.dir, exist_ok=True)
        self.netns, self.ip = kubelet.network.add_pod(self.name)
        obj["ip"] = self.ip
        self.shm_root = os.path.join(kubelet.shm, self.name)
        obj["shm_root"] = self.shm_root
        os.makedirs(self.shm_root, exist_ok=True)
        security = self.spec.get("securityContext", {})
        uid, gid = security.get("runAsUser", 0), security.get("fsGroup", security.get("runAsGroup", 0))
        os.chown(self.shm_root, uid, gid)
        os.chmod(self.shm_root, 0o1777)
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.resolv_file = os.path.join(self.dir, "resolv.conf")
        open(self.resolv_file, "w").close()
        self.volumes = cluster.materialize_volumes(obj, kubelet.index, self.dir, kubelet.pvc, uid, gid)
        self.init = [Container(self, c, True) for c in self.spec.get("initContainers", [])]
        self.containers = [Container(self, c, False) for c in self.spec["containers"]]
        self.phase = "Pending"
        self.deleted = False
        self.lock = threading.Lock()  # tick and delete: a deleted pod is never restarted

    def ready(self):
        return self.phase == "Running" and all(c.ready and c.running() for c in self.containers)

    def run_init(self):
        for c in self.init:
            for attempt in range(3):
                c.start()
                if c.proc.wait() == 0:
                    break
                c.restarts += 1
                time.sleep(2)
            else:
                raise RuntimeError("pod %s: init container %s failed; see %s" % (self.name, c.name, c.log_path))
        for c in self.containers:
            c.start()
        self.phase = "Running"

    def tick(self, now):
        """One kubelet pass: restart what exited or failed liveness (with back-off), probe."""
        with self.lock:
            if not self.deleted:
                self.tick_locked(now)

    def tick_locked(self, now):
        for c in self.containers:
            if c.running():
                if c.probe("liveness", now):
                    self.kubelet.event("%s/%s: liveness failed, restarting" % (self.name, c.name))
                    c.stop(self.spec.get("terminationGracePeriodSeconds", 30))
                    c.next_start = now + min(300, 10 * 2 ** min(c.restarts, 5))
                    c.restarts += 1
                    continue
                c.probe("readiness", now)
            elif now >= c.next_start:
                if c.proc is not None and c.next_start == 0:  # exited: back off first
                    self.kubelet.event("%s/%s exited with %s; restarting" % (self.name, c.name, c.proc.returncode))
                    c.next_start = now + min(300, 10 * 2 ** min(c.restarts, 5))
                    c.restarts += 1
                    c.ready = False
                    continue
                c.start()
                c.next_start = 0

    def delete(self):
        with self.lock:
            self.deleted = True
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        threads = [threading.Thread(target=c.stop, args=(grace,)) for c in self.containers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.phase = "Succeeded"
        self.kubelet.network.remove_pod(self.name)


class Kubelet:
    def __init__(self, work, prl, index, network, events):
        self.work, self.prl, self.index, self.network = work, prl, index, network
        self.shm = "/dev/shm/prl-rehearsal-%s" % network.run_id
        self.pvc = os.path.join(work, "pvc")
        os.makedirs(self.shm, exist_ok=True)
        os.makedirs(self.pvc, exist_ok=True)
        self.pods = {}
        self.lock = threading.Lock()
        self.events = events
        self.stopping = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def event(self, text):
        self.events.append((time.time(), text))
        print("kubelet: " + text, flush=True)

    def create(self, obj):
        pod = Pod(self, obj)
        with self.lock:
            self.pods[pod.name] = pod
        return pod

    def start(self, pod):
        pod.run_init()
        self.event("%s started (%s)" % (pod.name, pod.ip))

    def delete(self, name):
        with self.lock:
            pod = self.pods.pop(name)
        pod.delete()
        self.event("%s deleted" % name)

    def loop(self):
        while not self.stopping:
            with self.lock:
                pods = [p for p in self.pods.values() if p.phase == "Running"]
            for p in pods:
                p.tick(time.time())
            time.sleep(0.25)

    def shutdown(self):
        self.stopping = True
        for name in list(self.pods):
            self.delete(name)
