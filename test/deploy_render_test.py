#!/usr/bin/env python3
"""Renders the deployment examples with a fake environment and checks them.

  test/deploy_render_test.py SOURCE_DIR BUILD_DIR

scripts/deploy/k8s/psd-mnist.yaml (parsed with PyYAML): the image is the one
scripts/deploy/Dockerfile's `docker build -t` makes; psd runs in the ps role
with a checkpoints volume, its --http_port exposed, scraped (prometheus.io/*)
and probed on /healthz; every pod's TF_CONFIG, with $(TASK_INDEX) put in as
Kubernetes would for its index, parses with the project's ClusterSpec
(BUILD_DIR/test/cluster_env) into one cluster whose addresses are the pods'
DNS names; and a psd started with the manifest's own flags and ps 1's
TF_CONFIG (its hosts moved to 127.0.0.1) listens on ps 1's port and answers
/healthz on its HTTP port.

scripts/deploy/slurm/train.sbatch: GPUs are asked for in the workers'
component only; every task's SLURM_* environment, simulated from the
#SBATCH lines as a heterogeneous step, gives one cluster in which the first
component's tasks are the ps tasks and --num_gpus is the allocation's.

Every flag either file passes to psd or mnist_trainer must be in that
program's --help. Exit 1 listing every problem; 77 (SKIP) without PyYAML.
"""
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (apt-get install python3-yaml)")
    sys.exit(77)

src, build = sys.argv[1], sys.argv[2]
PROGRAMS = {"psd": os.path.join(build, "server", "psd"),
            "mnist_trainer": os.path.join(build, "examples", "mnist_trainer")}
CLUSTER_ENV = os.path.join(build, "test", "cluster_env")
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)
    return ok


_help = {}


def known_flags(program):
    if program not in _help:
        out = subprocess.run([PROGRAMS[program], "--help"], capture_output=True, text=True, timeout=30)
        _help[program] = set(re.findall(r"(--[a-z][a-z0-9_]*)", out.stdout + out.stderr))
    return _help[program]


def flag_values(args):
    """{--flag: value or None} of a command line's words."""
    out = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        name, eq, value = a.partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value = args[i + 1]
        out[name] = value if (eq or value) else None
    return out


def check_flags(where, program, args):
    for name in flag_values(args):
        check(name in known_flags(program), f"{where}: {program} has no {name} (not in its --help)")


def cluster_of(env, *args):
    """The ClusterSpec (as cluster_env prints it) that `env` gives."""
    run = subprocess.run([CLUSTER_ENV, *map(str, args)], env=env, capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        problems.append(f"ClusterSpec refuses {env}: {run.stderr.strip()}")
        return None
    return json.loads(run.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the image --------------------------------------------------------------
dockerfile = open(os.path.join(src, "scripts/deploy/Dockerfile")).read()
m = re.search(r"docker build -f scripts/deploy/Dockerfile -t (\S+) \.", dockerfile)
image = m.group(1) if check(m, "Dockerfile: no `docker build -f scripts/deploy/Dockerfile -t IMAGE .` line") else None
check(re.search(r"^FROM debian:12\S* AS build$", dockerfile, re.M), "Dockerfile: no Debian 12 build stage")
check(re.search(r"^FROM debian:12\S* AS runtime$", dockerfile, re.M), "Dockerfile: no Debian 12 runtime stage")
check("COPY --from=build" in dockerfile, "Dockerfile: the runtime stage copies nothing from the build stage")

# --- Kubernetes -------------------------------------------------------------
docs = list(yaml.safe_load_all(open(os.path.join(src, "scripts/deploy/k8s/psd-mnist.yaml"))))
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
sts, job = by_kind["StatefulSet"][0], by_kind["Job"][0]
services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
ns = sts["metadata"]["namespace"]


def expand(env_list, index):
    """The container's environment as Kubernetes makes it for pod `index`:
    fieldRefs to the pod index, then $(VAR) references to earlier entries."""
    env = {}
    for e in env_list:
        if "valueFrom" in e:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            check(path in ("metadata.labels['apps.kubernetes.io/pod-index']",
                           "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
                  f"env {e['name']}: unexpected fieldRef {path}")
            env[e["name"]] = str(index)
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda v: env.get(v.group(1), v.group(0)), e["value"])
    return env


pod = sts["spec"]["template"]
psd_c = pod["spec"]["containers"][0]
cmd = psd_c["command"] + psd_c.get("args", [])
check(cmd[0] == "psd", f"StatefulSet runs {cmd[0]}, not psd")
check_flags("StatefulSet", "psd", cmd[1:])
flags = flag_values(cmd[1:])
ports = {p.get("name"): p["containerPort"] for p in psd_c["ports"]}
http_port = flags.get("--http_port")
check(http_port and http_port.isdigit() and int(http_port) == ports.get("http"),
      f"--http_port={http_port} is not the container port named http ({ports})")
notes = pod["metadata"].get("annotations", {})
check(notes.get("prometheus.io/scrape") == "true", "psd pods lack prometheus.io/scrape: \"true\"")
check(notes.get("prometheus.io/port") == http_port, f"prometheus.io/port {notes.get('prometheus.io/port')} != --http_port {http_port}")
check(notes.get("prometheus.io/path") == "/metrics", "prometheus.io/path is not /metrics")
for probe in ("livenessProbe", "readinessProbe"):
    get = psd_c.get(probe, {}).get("httpGet", {})
    check(get.get("path") == "/healthz" and get.get("port") in ("http", ports.get("http")),
          f"{probe} is not GET /healthz on the HTTP port: {get}")
ckpt = flags.get("--checkpoint_dir")
mounts = {v["mountPath"]: v["name"] for v in psd_c.get("volumeMounts", [])}
claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
check(ckpt in mounts and mounts[ckpt] in claims,
      f"--checkpoint_dir={ckpt} is not a volume from the StatefulSet's volumeClaimTemplates ({mounts}, {claims})")
svc = services.get(sts["spec"]["serviceName"])
check(svc and svc["spec"].get("clusterIP") == "None", "the StatefulSet's serviceName is not a headless Service")

wpod = job["spec"]["template"]
trainer_c = wpod["spec"]["containers"][0]
wcmd = trainer_c["command"] + trainer_c.get("args", [])
check(wcmd[0] == "mnist_trainer", f"the Job runs {wcmd[0]}, not mnist_trainer")
check_flags("Job", "mnist_trainer", wcmd[1:])
check(job["spec"].get("completionMode") == "Indexed", "the workers' Job is not Indexed (no index for TF_CONFIG)")
wsvc = services.get(wpod["spec"].get("subdomain"))
check(wsvc and wsvc["spec"].get("clusterIP") == "None", "the Job's subdomain is not a headless Service")
for c in (psd_c, trainer_c):
    check(c["image"] == image, f"container {c['name']} runs image {c['image']}, the Dockerfile builds {image}")

specs = []
rpc = ports.get("rpc")
for i in range(sts["spec"]["replicas"]):
    s = cluster_of(expand(psd_c["env"], i))
    if s:
        check(s["job"] == "ps" and s["task_index"] == i, f"psd-{i}'s TF_CONFIG makes it {s['job']}:{s['task_index']}")
        want = f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}.{ns}.svc:{rpc}"
        check(s["self"] == want, f"psd-{i}'s address in TF_CONFIG is {s['self']}, its pod is {want}")
        specs.append(s)
for i in range(job["spec"]["completions"]):
    s = cluster_of(expand(trainer_c["env"], i))
    if s:
        check(s["worker_index"] == i, f"worker pod {i}'s TF_CONFIG makes it worker {s['worker_index']}")
        want = f"{job['metadata']['name']}-{i}.{wpod['spec']['subdomain']}.{ns}.svc:"
        check(s["self"].startswith(want), f"worker {i}'s address {s['self']} is not its pod's {want}*")
        specs.append(s)
if specs:
    check(all(s["ps"] == specs[0]["ps"] and s["workers"] == specs[0]["workers"] for s in specs),
          "the pods' TF_CONFIGs describe different clusters")
    check(len(specs[0]["ps"]) == sts["spec"]["replicas"], "TF_CONFIG's ps list is not the StatefulSet's replicas")
    check(len(specs[0]["workers"]) == job["spec"]["completions"], "TF_CONFIG's worker list is not the Job's completions")
    check(sum(s["is_chief"] for s in specs) == 1, "not exactly one chief")

# Kubeflow's TFJob (its TF_CONFIGs are test/cluster_spec_test.cc's): psd in the PS role, flags known.
tfjob = yaml.safe_load(open(os.path.join(src, "scripts/deploy/k8s/tfjob.yaml")))
for rtype, rspec in tfjob["spec"]["tfReplicaSpecs"].items():
    for c in rspec["template"]["spec"]["containers"]:
        tcmd = c["command"] + c.get("args", [])
        check(tcmd[0] == ("psd" if rtype == "PS" else "mnist_trainer"), f"TFJob {rtype} runs {tcmd[0]}")
        if tcmd[0] in PROGRAMS:
            check_flags(f"TFJob {rtype}", tcmd[0], tcmd[1:])
        check(c["image"] == image, f"TFJob {rtype} runs image {c['image']}, the Dockerfile builds {image}")
        if rtype == "PS":
            tflags = flag_values(tcmd[1:])
            tports = {p.get("name"): p["containerPort"] for p in c["ports"]}
            check(tflags.get("--checkpoint_dir") in {v["mountPath"] for v in c.get("volumeMounts", [])},
                  "TFJob PS: --checkpoint_dir is not a mounted volume")
            check(tflags.get("--http_port") == str(tports.get("http")) and
                  c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz",
                  "TFJob PS: --http_port is not the probed container port named http")

# psd itself, with the manifest's flags and ps 1's TF_CONFIG on 127.0.0.1.
with tempfile.TemporaryDirectory() as tmp:
    tf = json.loads(expand(psd_c["env"], 1)["TF_CONFIG"])
    my_port = free_port()
    tf["cluster"]["ps"] = [f"127.0.0.1:{free_port() if i != 1 else my_port}" for i in range(len(tf["cluster"]["ps"]))]
    tf["cluster"]["worker"] = [f"127.0.0.1:{free_port()}" for _ in tf["cluster"]["worker"]]
    args = [a for a in cmd[1:] if not a.startswith(("--checkpoint_dir", "--http_port"))]
    args += [f"--checkpoint_dir={tmp}/ckpt", "--http_port=any", f"--http_port_file={tmp}/http"]
    env = dict(os.environ, TF_CONFIG=json.dumps(tf))
    with open(f"{tmp}/psd.log", "w") as log:
        proc = subprocess.Popen([PROGRAMS["psd"], *args], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not os.path.exists(f"{tmp}/http") and proc.poll() is None:
            time.sleep(0.05)
        log_text = open(f"{tmp}/psd.log").read()
        if check(os.path.exists(f"{tmp}/http"), f"psd with ps 1's TF_CONFIG did not start: {log_text}"):
            time.sleep(0.1)
            http = int(open(f"{tmp}/http").read().strip())
            with socket.create_connection(("127.0.0.1", my_port), timeout=5):
                pass  # raises when psd does not listen on ps 1's port
            body = urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=5).read().decode()
            check(body.strip() == "ok", f"/healthz answered {body!r}")
            check(f"shard 1 of 2 at 127.0.0.1:{my_port}, from TF_CONFIG" in log_text,
                  f"psd does not say it took shard 1 from TF_CONFIG: {log_text}")
    except OSError as e:
        problems.append(f"psd with ps 1's TF_CONFIG: {e}: {open(tmp + '/psd.log').read()}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    check(os.path.isdir(f"{tmp}/ckpt/shard-1-of-2"), "psd (SIGTERM) wrote no checkpoint under shard-1-of-2")

# --- Slurm ------------------------------------------------------------------
sbatch = open(os.path.join(src, "scripts/deploy/slurm/train.sbatch")).read()
components = [{}]
for line in sbatch.splitlines():
    if line.startswith("#SBATCH"):
        words = line.split()[1:]
        if words == ["hetjob"]:
            components.append({})
            continue
        for w in words:
            k, _, v = w.partition("=")
            components[-1][k] = v
check(len(components) == 2, f"train.sbatch has {len(components)} components, expected 2 (ps, workers)")
ps_c, w_c = components[0], components[-1]
gpu_keys = ("--gpus", "--gpus-per-node", "--gpus-per-task", "--gres")
check(not any(k in ps_c for k in gpu_keys), f"the ps component asks for GPUs: {ps_c}")
check("--gpus-per-task" in w_c, f"the workers' component asks for no GPU per task: {w_c}")
gpus = int(w_c.get("--gpus-per-task", "0"))
variables = dict(re.findall(r"^([A-Z_]+)=(\S+)", sbatch, re.M))
# The batch environment of the allocation (a heterogeneous job's per-component variables).
batch_env = {"SLURM_GPUS_PER_TASK_HET_GROUP_1": str(gpus), "SLURM_JOB_ID": "4242", "HOME": "/home/u"}


def shell_value(word, outer=()):
    """`word` as the batch script's shell expands it: its own variables (a
    variable's default, ${X:-d}, applies where the environment has no X)."""
    def one(m):
        name, default = m.group(1) or m.group(3), m.group(2)
        if name in batch_env:
            return batch_env[name]
        if name in variables and name not in outer:
            return shell_value(variables[name], outer + (name,))
        return shell_value(default, outer) if default is not None else m.group(0)
    return re.sub(r"\$\{(\w+):-([^}]*)\}|\$\{?(\w+)\}?", one, word)


srun = re.search(r"^srun .*?(?<!\\)$", sbatch.replace("\\\n", " "), re.M)
words = [shell_value(w) for w in shlex.split(srun.group(0))] if check(srun, "train.sbatch runs no srun") else []
parts, cur = [], []
for w in words[1:]:
    if w == ":":
        parts.append(cur)
        cur = []
    else:
        cur.append(w)
parts.append(cur)
check(len(parts) == 2, f"srun starts {len(parts)} components, expected psd : mnist_trainer")
progs = []
for part in parts:
    i = next((k for k, w in enumerate(part) if not w.startswith("-")), len(part))
    srun_opts, prog = part[:i], part[i:]
    name = os.path.basename(prog[0]) if prog else "?"
    check(name in PROGRAMS, f"srun component runs {name}")
    if name in PROGRAMS:
        check_flags("train.sbatch", name, prog[1:])
    progs.append((name, flag_values(prog[1:]), srun_opts))
if len(progs) == 2:
    (p_name, p_flags, _), (w_name, w_flags, _) = progs
    check((p_name, w_name) == ("psd", "mnist_trainer"), f"srun runs {p_name} : {w_name}")
    num_ps = int(p_flags.get("--slurm_num_ps", 0))
    check(p_flags.get("--slurm_num_ps") == w_flags.get("--slurm_num_ps") and
          p_flags.get("--port_base") == w_flags.get("--port_base"),
          "psd and mnist_trainer get different --slurm_num_ps/--port_base")
    check(w_flags.get("--num_gpus") == str(gpus), f"--num_gpus={w_flags.get('--num_gpus')}, the allocation gives {gpus}")
    check(p_flags.get("--checkpoint_dir") and p_flags.get("--http_port", "0").isdigit(),
          "psd under Slurm has no --checkpoint_dir or no fixed --http_port")
    nodes0, per0 = int(ps_c["--nodes"]), int(ps_c.get("--ntasks-per-node", 1))
    nodes1, per1 = int(w_c["--nodes"]), int(w_c["--ntasks-per-node"])
    check(num_ps == nodes0 * per0, f"--slurm_num_ps={num_ps}, the ps component has {nodes0 * per0} tasks")
    port_base = int(p_flags.get("--port_base", 2222))
    ntasks = nodes0 * per0 + nodes1 * per1
    slurm = {"SLURM_NTASKS": str(ntasks),
             "SLURM_STEP_NODELIST": "cpu[01-%02d],gpu[01-%02d]" % (nodes0, nodes1),
             "SLURM_STEP_TASKS_PER_NODE": f"{per0}(x{nodes0}),{per1}(x{nodes1})"}
    first = None
    for rank in range(ntasks):
        local = rank % per0 if rank < num_ps else (rank - num_ps) % per1
        node = "cpu%02d" % (rank // per0 + 1) if rank < num_ps else "gpu%02d" % ((rank - num_ps) // per1 + 1)
        s = cluster_of(dict(slurm, SLURM_PROCID=str(rank), SLURM_LOCALID=str(local), SLURMD_NODENAME=node),
                       num_ps, port_base)
        if not s:
            continue
        first = first or s
        check(s["ps"] == first["ps"] and s["workers"] == first["workers"], f"Slurm task {rank}: another cluster")
        check((s["job"] == "ps") == (rank < num_ps), f"Slurm task {rank} is {s['job']}")
        check(s["self"].startswith("cpu" if rank < num_ps else "gpu"), f"Slurm task {rank} at {s['self']}")
        if rank >= num_ps:
            check(s["local_gpu"] == local and local + gpus <= per1 * gpus,
                  f"Slurm worker {rank}: GPU {s['local_gpu']} of its node's {per1 * gpus}")
    if first:
        check(first["ps"] == [f"cpu{n:02d}:{port_base}" for n in range(1, nodes0 + 1)], f"ps hosts {first['ps']}")

for p in problems:
    print("FAIL:", p)
print(f"deploy_render: {len(problems)} problem(s); flags checked against --help of {sorted(_help)}")
sys.exit(1 if problems else 0)
