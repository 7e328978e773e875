"""Checks that the rendered Kubernetes manifests (deploy/kubernetes) fit the gateway they run.

    check_manifests.py RENDERED.yaml CTXGATE_BIN Dockerfile

- The ConfigMap's ctxgate.toml, with the Deployment's environment (secrets replaced by stand-ins), is accepted by
  `ctxgate check-config`; the effective config is then what the rest is checked against.
- The Deployment mounts it where the image's entrypoint reads it, runs as the image's user, on a read-only root
  filesystem, with readiness on /readyz, liveness and start-up on /healthz, on the port the config listens on.
- terminationGracePeriodSeconds exceeds the preStop pause + server.shutdown_grace_secs + server.drain_secs.
- The memory limit is at least the sizing sum of docs/operations.md ("Memory: what grows with traffic"):
  idle + 1.25 x store.cache_max_bytes + the bounded tables + 24 KB x server.max_connections
  + 0.5 MB x server.max_in_flight + server.request_memory_bytes.
- Redis keeps its data on a volume with the append-only file on.
Exits non-zero, naming every failed check, when any fails.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

# The sizing figures of docs/operations.md, "Memory: what grows with traffic" (and "Running on Kubernetes"):
# keep them equal. The cache weighs what its sessions really hold (within 20 %); the tables are sized by it (see
# `tables_bytes`).
IDLE_BYTES = 52_000_000
CACHE_FACTOR = 1.25
TOKEN_MEMO_ENTRY_BYTES = 257
SMALL_TABLES_BYTES = 4_000_000
PER_CONNECTION_BYTES = 24_000
PER_IN_FLIGHT_BYTES = 500_000

UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "K": 1000, "M": 1000**2, "G": 1000**3, "": 1}


def tables_bytes(cache_max_bytes):
    """The memos at their bounds for a history cache of `cache_max_bytes`: one token count per KiB of it (4,096 to
    500,000), the planner's memos of strings and prefixes (16 and 64 bytes per count, at most 16 and 32 MiB), the
    parse memo an eighth of it (at most 32 MiB), and the small tables."""
    counts = min(max(cache_max_bytes // 1024, 4_096), 500_000)
    planner = min(16 * counts, 16 * 2**20) + min(64 * counts, 32 * 2**20)
    return TOKEN_MEMO_ENTRY_BYTES * counts + planner + min(cache_max_bytes // 8, 32 * 2**20) + SMALL_TABLES_BYTES


def quantity(text):
    """Bytes of a Kubernetes memory quantity such as 512Mi."""
    m = re.fullmatch(r"(\d+)([KMG]i?)?", str(text))
    if not m:
        raise ValueError(f"unsupported quantity {text!r}")
    return int(m.group(1)) * UNITS[m.group(2) or ""]


def only(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    if len(found) != 1:
        raise SystemExit(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def container_env(container):
    """The container's environment as ctxgate would see it: secrets as stand-ins, $(VAR) references expanded."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            refs = r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)"
            env[var["name"]] = re.sub(refs, lambda m: env.get(m.group(1), m.group(0)), var["value"])
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = f"stand-in-for-{ref['key']}"
    return env


def main():
    rendered, binary, dockerfile = sys.argv[1:4]
    with open(rendered, encoding="utf-8") as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    with open(dockerfile, encoding="utf-8") as f:
        docker = f.read()
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    for kind in ("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "StatefulSet", "ConfigMap"):
        check(any(o["kind"] == kind for o in objects), f"no {kind} rendered")

    deploy = only(objects, "Deployment", "ctxgate")
    pod = deploy["spec"]["template"]["spec"]
    (gw,) = [c for c in pod["containers"] if c["name"] == "ctxgate"]
    config_map = only(objects, "ConfigMap")
    toml_text = config_map["data"]["ctxgate.toml"]

    # 1. The config, as the gateway reads it.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env.update(container_env(gw))
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False, encoding="utf-8") as f:
        f.write(toml_text)
        path = f.name
    try:
        run = subprocess.run([binary, "check-config", path], env=env, capture_output=True, text=True)
    finally:
        os.unlink(path)
    if run.returncode != 0:
        raise SystemExit(f"ctxgate check-config refused the ConfigMap's ctxgate.toml:\n{run.stderr}{run.stdout}")
    cfg = tomllib.loads(run.stdout)
    server, store = cfg["server"], cfg["store"]
    check(store["backend"] == "redis", f"store.backend is {store['backend']!r}: several replicas need redis")
    check("stand-in-for-redis-password" not in run.stdout, "check-config printed the Redis password")
    check("ctxgate-redis:6379" in store["redis_url"], f"store.redis_url {store['redis_url']!r} is not the Redis Service")

    # 2. The Deployment against the image and the config.
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", docker, re.M).group(1))
    config_path = entry[entry.index("--config") + 1]
    (mount,) = [m for m in gw["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    check(volume["configMap"]["name"] == config_map["metadata"]["name"], "the config volume is not the ConfigMap")
    check(f"{mount['mountPath']}/ctxgate.toml" == config_path, f"the ConfigMap is not mounted at {config_path}")
    uid, gid = re.search(r"^USER (\d+):(\d+)$", docker, re.M).groups()
    sec = pod["securityContext"]
    check(sec.get("runAsNonRoot") is True, "runAsNonRoot is not set")
    check((str(sec.get("runAsUser")), str(sec.get("runAsGroup"))) == (uid, gid), f"not the image's user {uid}:{gid}")
    check(gw["securityContext"].get("readOnlyRootFilesystem") is True, "the root filesystem is writable")
    port = int(server["listen"].rsplit(":", 1)[1])
    check([p["containerPort"] for p in gw["ports"]] == [port], f"containerPort is not the listen port {port}")
    check(deploy["spec"]["replicas"] == 2, "the Deployment does not run 2 replicas")
    check(gw["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness is not /readyz")
    check(gw["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness is not /healthz")
    check(gw["startupProbe"]["httpGet"]["path"] == "/healthz", "no start-up probe on /healthz")

    # 3. Shutdown: the kubelet's SIGKILL comes after the gateway's own deadline.
    pause = 0
    pre_stop = gw.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if pre_stop[:1] == ["sleep"]:
        pause = int(pre_stop[1])
    deadline = pause + server["shutdown_grace_secs"] + server["drain_secs"]
    grace = pod["terminationGracePeriodSeconds"]
    check(grace > deadline, f"terminationGracePeriodSeconds {grace} is not above the drain deadline {deadline}")

    # 4. Memory: the limit covers the sizing sum, and requests equal it.
    in_flight = server["max_in_flight"]
    check(in_flight > 0, "server.max_in_flight is 0 (unbounded): no memory limit can cover it")
    requests = server["request_memory_bytes"]
    check(requests > 0, "server.request_memory_bytes is 0 (unbounded): no memory limit can cover it")
    need = (IDLE_BYTES + CACHE_FACTOR * store["cache_max_bytes"] + tables_bytes(store["cache_max_bytes"])
            + PER_CONNECTION_BYTES * server["max_connections"] + PER_IN_FLIGHT_BYTES * in_flight + requests)
    limit = quantity(gw["resources"]["limits"]["memory"])
    check(limit >= need, f"memory limit {limit / 2**20:.0f} MiB is below the sizing sum {need / 2**20:.0f} MiB")
    check(quantity(gw["resources"]["requests"]["memory"]) == limit, "the memory request is not the limit")

    # 5. Redis: a volume and the append-only file.
    redis = only(objects, "StatefulSet", "ctxgate-redis")
    (rc,) = redis["spec"]["template"]["spec"]["containers"]
    args = rc.get("args", [])
    check("--appendonly" in args and args[args.index("--appendonly") + 1] == "yes", "Redis runs without AOF")
    check(any(m["mountPath"] == "/data" for m in rc["volumeMounts"]) and redis["spec"].get("volumeClaimTemplates"),
          "Redis keeps /data on no persistent volume")

    if failures:
        print("deploy/kubernetes does not fit the gateway:", *failures, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print(f"deploy/kubernetes: config accepted by ctxgate check-config; grace {grace} s > drain deadline {deadline} s; "
          f"memory limit {limit / 2**20:.0f} MiB >= sizing sum {need / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
