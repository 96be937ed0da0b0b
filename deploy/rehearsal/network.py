"""The rehearsal's pod network: one Linux bridge on the host (the "node"), a network namespace
per pod with a veth on the bridge and an address of its own (the pod IP), and per pod a hosts
file through which the Service names and the StatefulSet pod names resolve, as cluster DNS
would. The host reaches every pod at its IP (the kubelet's probes, Prometheus).

Names are prefixed with the run's id, so that leftovers of a killed run are found and removed
(remove_leftovers) and two runs never meet.
"""
import ipaddress
import os
import signal
import subprocess
import threading


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class Network:
    def __init__(self, run_id, subnet):
        self.run_id = run_id
        self.net = ipaddress.ip_network(subnet)
        self.gateway = str(self.net.network_address + 1)
        self.bridge = "prlbr%s" % run_id
        self.next_host = 10
        self.netns = {}  # pod name -> netns name
        self.lock = threading.Lock()

    def create(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", "%s/%d" % (self.gateway, self.net.prefixlen), "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def add_pod(self, pod_name):
        """A namespace with its own address on the bridge; returns (netns, pod IP)."""
        with self.lock:
            index = self.next_host
            self.next_host += 1
        ip = str(self.net.network_address + index)
        ns = "prl%s-%s" % (self.run_id, pod_name)
        host_if, pod_if = "pv%s-%d" % (self.run_id, index), "eth0"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "pp%s-%d" % (self.run_id, index))
        sh("ip", "link", "set", "pp%s-%d" % (self.run_id, index), "netns", ns)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "pp%s-%d" % (self.run_id, index), "name", pod_if)
        sh("ip", "link", "set", host_if, "master", self.bridge)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", "%s/%d" % (ip, self.net.prefixlen), "dev", pod_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", pod_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", self.gateway)
        with self.lock:
            self.netns[pod_name] = ns
        return ns, ip

    def remove_pod(self, pod_name):
        with self.lock:
            ns = self.netns.pop(pod_name, None)
        if ns:
            sh("ip", "netns", "del", ns, check=False)  # takes its veth along

    def destroy(self):
        for pod in list(self.netns):
            self.remove_pod(pod)
        sh("ip", "link", "del", self.bridge, check=False)


def remove_leftovers(run_id):
    """Processes, namespaces and the bridge of run `run_id`, whatever state it died in: every
    process in one of its namespaces is one of its containers."""
    listed = sh("ip", "netns", "list", check=False).stdout.split()
    for ns in (n for n in listed if n.startswith("prl%s-" % run_id)):
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", "prlbr%s" % run_id, check=False)


def write_hosts(path, pod_name, pod_ip, names):
    """The pod's /etc/hosts: itself, then `names` ({name: ip}) as cluster DNS would answer."""
    lines = ["127.0.0.1 localhost", "%s %s" % (pod_ip, pod_name)]
    by_ip = {}
    for name, ip in sorted(names.items()):
        by_ip.setdefault(ip, []).append(name)
    lines += ["%s %s" % (ip, " ".join(n)) for ip, n in sorted(by_ip.items())]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
