"""What the Python example trainers share: TensorFlow's cluster flags, the
cluster they name (flags, TF_CONFIG or Slurm), the ps role (this process
becomes psd) and the main() that reports bad input in one line.

    p = argparse.ArgumentParser()
    cluster_flags.add(p)                      # --ps_hosts --worker_hosts --job_name --task_index ...
    p.add_argument("--batch_size", ...)
    ...
    sys.exit(cluster_flags.main("my_trainer", p, check_flags, run_worker, sys.argv[1:]))
"""

import math
import os
import pathlib
import shutil
import sys

import psclient

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]


class BadInput(Exception):
    """A flag or a data file the program cannot use: one line, exit code 2."""


def add(p):
    """The flags every example trainer takes, as examples/mnist_trainer's."""
    p.add_argument("--ps_hosts", default="", help="comma-separated host:port of the ps tasks")
    p.add_argument("--worker_hosts", default="", help="comma-separated host:port of the workers (chief first)")
    p.add_argument("--job_name", default="", help="ps, worker or chief")
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--num_ps", type=int, default=1, help="Slurm: the first N tasks are ps")
    p.add_argument("--port_base", type=int, default=2222, help="Slurm: task ports start here")
    p.add_argument("--sync_replicas", action="store_true", help="average the workers' gradients per step")
    p.add_argument("--replicas_to_aggregate", type=int, default=0, help="sync: gradients per step (0: every worker)")
    p.add_argument("--max_staleness", type=int, default=0, help="> 0: bounded staleness (async otherwise)")
    p.add_argument("--train_steps", type=int, default=0, help="global steps; 0: from --epochs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log_every", type=int, default=100, help="a progress line every N local steps")
    p.add_argument("--logdir", default="", help="chief: TensorBoard summaries here")
    p.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads per worker")
    p.add_argument("--connect_timeout", type=float, default=30)
    p.add_argument("--port_file", default="", help="ps: psd writes its port here")
    p.add_argument("--psd", default="", help="ps: the psd binary (default: $PSD_BIN, build/server/psd, psd on PATH)")


def check(f, more):
    """Raises BadInput with the first failed (ok, message) of the shared flags' checks and `more`."""
    checks = [
        (f.train_steps >= 0, "--train_steps must be >= 0"),
        (math.isfinite(f.connect_timeout) and f.connect_timeout > 0, "--connect_timeout must be > 0"),
        (f.log_every >= 0, "--log_every must be >= 0"),
        (f.threads >= 1, "--threads must be >= 1"),
        (f.replicas_to_aggregate >= 0, "--replicas_to_aggregate must be >= 0"),
        (f.max_staleness >= 0, "--max_staleness must be >= 0"),
    ] + list(more)
    for ok, message in checks:
        if not ok:
            raise BadInput(message)


def cluster_spec(f):
    if f.ps_hosts or f.worker_hosts:
        # --ps_hosts alone: one worker, as mnist_trainer (workers do not listen).
        return psclient.ClusterSpec.from_flags(f.ps_hosts, f.worker_hosts or "127.0.0.1:1", f.job_name or "worker",
                                               f.task_index)
    return psclient.ClusterSpec.from_environment(num_ps=f.num_ps, port_base=f.port_base)


def exec_psd(spec, f, psd_flags):
    """--job_name=ps: this process becomes psd, shard task_index of the ps hosts."""
    psd = f.psd or os.environ.get("PSD_BIN") or str(SOURCE_DIR / "build" / "server" / "psd")
    if not os.access(psd, os.X_OK):
        psd = shutil.which("psd") or psd
    args = [psd, "--ps_hosts", ",".join(spec.ps_hosts), "--task_index", str(spec.task_index)]
    if f.port_file:
        args += ["--port_file", f.port_file]
    sys.stdout.flush()
    os.execv(psd, args + psd_flags)


def end_barrier(client, name, workers, worker):
    """Every worker meets once more after training, so that the chief reads the final model. Workers psd
    has lost (a dead one) are not waited for; a barrier that fails, or ends without them, is reported and
    the worker goes on: the model is on psd either way."""
    try:
        came = client.barrier(name, workers, timeout=60, skip_lost_workers=True)
        if came < workers:
            print(f"worker {worker}: end barrier: {came} of {workers} workers came; psd had lost the others",
                  file=sys.stderr)
    except psclient.Error as e:
        print(f"worker {worker}: end barrier: {e} (going on)", file=sys.stderr)


def unknown_flags(parser, rest):
    """What the C++ trainers say of flags they do not know: the first, and the flag it is
    closest to (parse_known_args leaves them; abbreviations are off, so --epoch is one)."""
    import difflib
    flag = next((a.split("=", 1)[0] for a in rest if a.startswith("-")), rest[0])
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(flag, known, n=1)
    return f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else "") + "; see --help"


def main(name, parser, check_flags, run_worker, argv):
    """Parses argv, becomes psd for the ps role, else runs run_worker(spec, flags).
    One line on stderr and the C++ trainers' exit codes: 2 for bad input (a flag, a
    psclient.ConfigError), 3 for a ps that cannot be reached, 1 for any other psclient error."""
    f, rest = parser.parse_known_args(argv)
    try:
        check_flags(f)
        spec = cluster_spec(f)
        if spec.is_ps:
            exec_psd(spec, f, rest)
        if rest:
            raise BadInput(unknown_flags(parser, rest))
        if not spec.is_worker:
            raise BadInput(f"nothing to do for {spec}")
        return run_worker(spec, f)
    except (BadInput, psclient.ConfigError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except psclient.ConnectionError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 3
    except psclient.Error as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1
