#!/usr/bin/env python3
"""torch_ctr: wide & deep click-through prediction in PyTorch, its tables and weights on psd.

examples/ctr_trainer's model, data and features, written in PyTorch: the 26
categorical fields of each example are ids in one dynamic embedding table of
rows (--embedding_dim floats, Adagrad on psd), the 13 dense features and the
26 rows feed an MLP (429-256-128-1) whose weights are dense tensors on psd
(Adam), and a wide linear part adds one weight per field value and per cross
of neighbouring fields, from a dynamic table of one float per id (FTRL on
psd). Each step is one TrainingSession step: it pulls the batch's rows and
the weights, runs forward and backward in PyTorch, and pushes the weights'
gradients and the rows' gradients (summed per id by the client). The
weights and tables are bound to the session with psclient.torch.

    scripts/launch_local.sh --trainer examples/python/torch_ctr.py -- --synthetic 300000   # 1 ps + 3 workers
    torch_ctr.py --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222 \\
                 --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 --train_file=data/ctr/train.tsv

Data: a file in the Criteo TSV layout or a CSV with a header as Avazu's
train.csv (--train_file, each worker reading its share; --eval_file, else the
last --holdout of it), as scripts/make_ctr_data.sh writes, or --synthetic N
examples of ctr_trainer's planted model drawn in memory; then the chief also
prints the planted model's own held-out AUC, the best any learner can do.
The chief ends with a RESULT line as ctr_trainer's. Without
--ps_hosts/--worker_hosts the cluster comes from TF_CONFIG or Slurm.
"""

import argparse
import math
import sys
import time

import numpy as np
import torch

import cluster_flags  # beside this file
import psclient
import psclient.torch as pst
from cluster_flags import BadInput

DEEP_TABLE = "ctr/deep_embeddings"
WIDE_TABLE = "ctr/wide_weights"
DENSE, FIELDS = 13, 26


def parser():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    cluster_flags.add(p)
    p.add_argument("--train_file", default="data/ctr/train.tsv",
                   help="Criteo TSV layout, or a CSV with a header as Avazu's train.csv; each worker reads its share")
    p.add_argument("--eval_file", default="", help="held-out examples (default: the last --holdout of the training file)")
    p.add_argument("--holdout", type=float, default=0.1, help="share of the examples held out for evaluation")
    p.add_argument("--stream_data", action="store_true",
                   help="read this worker's share of --train_file batch by batch (in file order) instead of holding "
                        "it in memory: data larger than memory")
    p.add_argument("--synthetic", type=int, default=0, help="> 0: this many examples of the planted model instead of a file")
    p.add_argument("--synthetic_seed", type=int, default=1)
    p.add_argument("--synthetic_max_distinct", type=int, default=1000000, help="distinct values of the last field")
    p.add_argument("--epochs", type=float, default=1)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--learning_rate", type=float, default=0.001, help="Adam on the MLP's weights")
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--hidden_units", default="256,128", help="the MLP's hidden layers, comma-separated")
    p.add_argument("--embedding_learning_rate", type=float, default=0.05, help="Adagrad on the deep table")
    p.add_argument("--embedding_init", type=float, default=0.0, help="rows start uniform in [-x, x]")
    p.add_argument("--wide_learning_rate", type=float, default=0.01, help="FTRL on the wide table")
    p.add_argument("--ftrl_l1", type=float, default=0.0)
    p.add_argument("--ftrl_l2", type=float, default=0.0)
    p.add_argument("--row_limit", type=int, default=0, help="rows per table and shard (0: none); beyond it the "
                   "least recently used rows are evicted")
    p.add_argument("--min_count", type=int, default=0, help="a new id gets a row at its Nth push (0, 1: at once); "
                   "until then it reads as its initial values and its gradients are dropped")
    p.add_argument("--count_sketch_width", type=int, default=0,
                   help="--min_count's counters per shard and table, 4 bytes each, a power of two "
                   "(0: 4194304); about the distinct ids a shard sees")
    p.add_argument("--expire_after_steps", type=int, default=0,
                   help="rows neither pulled nor pushed in this many global steps are dropped (0: never)")
    p.add_argument("--eval_batch", type=int, default=4096)
    p.add_argument("--restore_from", default="", help="chief: start from the newest checkpoint in this directory "
                   "(a ps --checkpoint_dir), tables included, and go on from its step")
    return p


def check_flags(f):
    finite = math.isfinite
    cluster_flags.check(f, [
        (not (f.stream_data and f.synthetic > 0), "--stream_data reads --train_file; --synthetic draws in memory"),
        (f.batch_size >= 1, "--batch_size must be >= 1"),
        (finite(f.epochs) and f.epochs >= 0, "--epochs must be a finite number >= 0"),
        (f.train_steps > 0 or f.epochs > 0, "give --train_steps or --epochs (both are 0)"),
        (0 <= f.holdout < 1, "--holdout must be in [0, 1)"),
        (f.synthetic >= 0, "--synthetic must be >= 0"),
        (1 <= f.embedding_dim <= 1024, "--embedding_dim must be in 1..1024"),
        (f.eval_batch >= 1, "--eval_batch must be >= 1"),
        (f.row_limit >= 0, "--row_limit must be >= 0"),
        (0 <= f.min_count <= 255, "--min_count must be in 0..255"),
        (0 <= f.count_sketch_width <= 2**28, "--count_sketch_width must be in 0..2**28"),
        (0 <= f.expire_after_steps <= 2**30, "--expire_after_steps must be in 0..2**30"),
        (hidden_units(f.hidden_units) is not None, "--hidden_units must be positive integers, comma-separated"),
    ] + [(finite(v) and v > 0, f"--{name} must be > 0") for name, v in
         (("learning_rate", f.learning_rate), ("embedding_learning_rate", f.embedding_learning_rate),
          ("wide_learning_rate", f.wide_learning_rate))] + [
        (finite(v) and v >= 0, f"--{name} must be >= 0") for name, v in
        (("ftrl_l1", f.ftrl_l1), ("ftrl_l2", f.ftrl_l2), ("embedding_init", f.embedding_init))])


def hidden_units(text):
    """'256,128' -> [256, 128]; None when it is not a list of positive integers."""
    try:
        units = [int(u) for u in text.split(",")]
    except ValueError:
        return None
    return units if units and all(u > 0 for u in units) else None


def load_data(f, worker, workers, chief):
    """(this worker's training share, the held-out examples or None, training examples over all workers,
    the planted model's (log-loss, AUC) on the held-out part or None)."""
    if f.synthetic > 0:
        opts = dict(seed=f.synthetic_seed, max_distinct=f.synthetic_max_distinct, holdout=f.holdout)
        train = psclient.ctr_synthetic(f.synthetic, part="train", worker=worker, workers=workers, **opts)
        total = f.synthetic - math.floor(f.synthetic * f.holdout + 0.5)  # as the C++ llround
        held, planted = None, None
        if chief:
            held = psclient.ctr_synthetic(f.synthetic, part="holdout", **opts)
            total = f.synthetic - len(held["labels"])
            if len(held["labels"]):
                planted = (psclient.log_loss(held["labels"], held["planted"]),
                           psclient.roc_auc(held["labels"], held["planted"]))
        return train, held, total, planted
    def progress(doing, done, total):  # a large file takes minutes
        print(f"worker {worker}: {doing} {f.train_file}: {100 * done / max(1, total):.0f}% of "
              f"{total / 1e9:.2f} GB", flush=True)

    try:
        share = psclient.read_ctr_share(f.train_file, holdout=0.0 if f.eval_file else f.holdout, worker=worker,
                                        workers=workers, keep_train=not f.stream_data,
                                        keep_holdout=chief and not f.eval_file, progress=progress)
        held = psclient.read_ctr(f.eval_file) if chief and f.eval_file else share["holdout"]
        if share["train_end"] <= 0:
            raise BadInput(f"{f.train_file}: no training examples (after holding out {f.holdout})")
        # --stream_data: only a batch in memory, read from the file as the steps take them.
        train = (psclient.CtrShareStream(f.train_file, worker, workers, share["train_end"]) if f.stream_data
                 else share["train"])
    except psclient.ConfigError as e:
        raise BadInput(f"{e} (--train_file; scripts/make_ctr_data.sh writes one, or use --synthetic N)") from None
    return train, held, share["train_end"], None


class Mlp(torch.nn.Module):
    """The deep part's head: dense features and the fields' rows in, ReLU hidden layers, one logit out."""

    def __init__(self, inputs, hidden):
        super().__init__()
        layers, width = [], inputs
        for units in hidden:
            layers += [torch.nn.Linear(width, units), torch.nn.ReLU()]
            width = units
        self.layers = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))

    def forward(self, x):
        return self.layers(x).squeeze(1)


def logits(mlp, dense, rows, wide_rows):
    """Each example's logit: the MLP over its dense features and its fields' rows (batch x fields x dim),
    plus the sum of its wide weights (batch x crosses x 1)."""
    b = dense.shape[0]
    return mlp(torch.cat([dense, rows.view(b, -1)], 1)) + wide_rows.view(b, -1).sum(1)


def evaluate(client, mlp, deep, wide, held, batch):
    """(log-loss, AUC) of the model on the held-out examples, rows read as the tables hold them now
    (lookup: a held-out id the tables have not seen reads as its initial values, not created)."""
    probs = np.empty(len(held["labels"]), np.float64)
    with torch.no_grad():
        for lo in range(0, len(probs), batch):
            hi = min(lo + batch, len(probs))
            z = logits(mlp, torch.from_numpy(held["dense"][lo:hi]), deep.lookup(client, held["ids"][lo:hi]),
                       wide.lookup(client, held["wide_ids"][lo:hi]))
            probs[lo:hi] = torch.sigmoid(z.double()).numpy()
    return psclient.log_loss(held["labels"], probs), psclient.roc_auc(held["labels"], probs)


def run_worker(spec, f):
    torch.set_num_threads(f.threads)
    torch.manual_seed(f.seed)
    workers, worker, chief = spec.num_workers, spec.worker_index, spec.is_chief
    train, held, total, planted = load_data(f, worker, workers, chief)
    streamed = isinstance(train, psclient.CtrShareStream)
    if (train.share_size if streamed else len(train["labels"])) == 0:
        raise BadInput(f"worker {worker} has no training examples ({total} for {workers} workers)")
    dim, b = f.embedding_dim, f.batch_size
    replicas = (f.replicas_to_aggregate or workers) if f.sync_replicas else 1
    steps = f.train_steps or max(1, math.ceil(f.epochs * total / (b * replicas)))
    mode = "sync" if f.sync_replicas else ("bounded_staleness" if f.max_staleness > 0 else "async")

    client = psclient.Client(spec.ps_hosts, worker_index=worker, is_chief=chief, connect_timeout=f.connect_timeout)
    session = psclient.TrainingSession(client, mode=mode, replicas_to_aggregate=replicas if f.sync_replicas else 0,
                                       total_replicas=workers, max_staleness=f.max_staleness, train_steps=steps,
                                       restore_from=f.restore_from if chief else "")
    # The MLP's weights and the two tables on psd. The weights take the mean
    # loss's gradient; the rows the summed loss's (each example's own, as
    # per-row Adagrad and FTRL take them): grad_scale is the batch's size.
    hidden = hidden_units(f.hidden_units)
    mlp = Mlp(DENSE + FIELDS * dim, hidden)
    params = pst.Parameters(session, mlp, optimizer=psclient.adam(f.learning_rate), prefix="ctr/", seed=f.seed)
    row_init = psclient.uniform(-f.embedding_init, f.embedding_init, f.seed) if f.embedding_init > 0 else psclient.zeros()
    row_options = dict(min_count=f.min_count, count_sketch_width=f.count_sketch_width, row_limit=f.row_limit,
                       on_limit="evict_lru", expire_after_steps=f.expire_after_steps)
    adagrad = psclient.RowOptimizerConfig.adagrad(f.embedding_learning_rate)
    ftrl = psclient.RowOptimizerConfig.ftrl(f.wide_learning_rate, f.ftrl_l1, f.ftrl_l2)
    deep = pst.Embedding(session, psclient.TableSpec(DEEP_TABLE, dim, dynamic=True, init=row_init, optimizer=adagrad,
                                                     **row_options))
    wide = pst.Embedding(session, psclient.TableSpec(WIDE_TABLE, 1, dynamic=True, optimizer=ftrl, **row_options))
    session.initialize()
    steps = session.job.train_steps or steps
    per_global = b * (session.job.replicas_to_aggregate if session.job.mode == psclient.SyncMode.SYNC else 1)
    if chief:
        print(f"worker {worker} (chief): wide & deep, {FIELDS} fields x {dim} + {DENSE} dense -> "
              f"{'-'.join(map(str, hidden))}-1, batch {b}, "
              f"{mode}, {steps} global steps ({steps * per_global / total:.2f} epochs of {total} examples), "
              f"{workers} workers, {spec.num_ps} ps", flush=True)
        if planted:
            print(f"planted model on the {len(held['labels'])} held-out examples: log-loss {planted[0]:.5f}, "
                  f"AUC {planted[1]:.5f}", flush=True)
    summaries = psclient.SummaryWriter(f.logdir) if chief and f.logdir else None

    # Batches drawn at random from the share in memory (sorted: rows read in
    # order), or the next ones from the file with --stream_data.
    n = train.share_size if streamed else len(train["labels"])
    rng = np.random.default_rng(f.seed + worker)
    order, pos = rng.permutation(n), 0

    def next_batch():
        nonlocal order, pos
        if streamed:
            return train.next(b)
        if pos + b > n:
            order, pos = rng.permutation(n), 0
        idx = np.sort(order[pos:pos + b]) if b <= n else np.arange(n)
        pos += b
        return {k: train[k][idx] for k in ("labels", "dense", "ids", "wide_ids")}

    start, cpu_at_start, first_step = time.monotonic(), time.process_time(), None
    while not session.should_stop:
        batch = next_batch()
        deep.set_ids(batch["ids"])
        wide.set_ids(batch["wide_ids"])
        step_read = pst.pull(session, params, deep, wide)
        if first_step is None:
            first_step = step_read  # a restored job starts past 0
        if session.should_stop:
            break  # the job ended while this worker waited for its step
        labels = torch.from_numpy(batch["labels"])
        deep.grad_scale = wide.grad_scale = len(labels)  # a short last batch too
        z = logits(mlp, torch.from_numpy(batch["dense"]), deep.rows(), wide.rows())
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels)
        pst.backward(loss, params, deep, wide)
        outcome = pst.push(session, params, deep, wide)
        local = session.steps_run
        if f.log_every and local % f.log_every == 0:
            rate = local * b / (time.monotonic() - start)
            print(f"worker {worker} | local step {local} | global step {outcome.global_step} | "
                  f"epoch {outcome.global_step * per_global / total:.2f} | loss {loss.item():.4f} | "
                  f"{rate:.0f} examples/s", flush=True)
            session.report(loss.item(), 0.0, rate, f.learning_rate)
            if summaries:
                summaries.add_scalar("loss", loss.item(), outcome.global_step)
    secs = time.monotonic() - start
    steps_done = max(1, session.steps_run)
    print(f"worker {worker}: done after {session.steps_run} local steps in {secs:.1f} s "
          f"({session.steps_run * b / secs:.0f} examples/s on this worker, {session.stale_steps} stale); "
          f"CPU {1e3 * (time.process_time() - cpu_at_start) / steps_done:.3f} ms per step", flush=True)

    cluster_flags.end_barrier(client, "torch_ctr/end", workers, worker)  # then the chief evaluates the final model
    if chief:
        final = params.pull(client)  # the weights as they ended
        global_step = max(final.step, session.global_step)
        examples_per_sec = (global_step - (first_step or 0)) * per_global / secs
        if held is not None and len(held["labels"]):
            log_loss, auc = evaluate(client, mlp, deep, wide, held, f.eval_batch)
            print(f"\n== {mode}: held-out log-loss {log_loss:.5f}, AUC {auc:.5f} on {len(held['labels'])} examples")
            if summaries:
                summaries.add_scalar("auc/holdout", auc, global_step)
                summaries.add_scalar("log_loss/holdout", log_loss, global_step)
        else:
            log_loss = auc = -1.0
        print(f"== {global_step} global steps, {global_step * per_global / total:.2f} epochs in {secs:.1f} s: "
              f"{examples_per_sec:.0f} examples/s", flush=True)
        tables = {t.name: t for t in client.list_tables()}
        print("== tables: " + ", ".join(f"{t.name} {t.rows} rows of {t.dim} ({t.bytes / 2**20:.1f} MiB)"
                                         for t in tables.values()), flush=True)
        planted_ll, planted_auc = planted or (-1.0, -1.0)
        print(f"RESULT mode={mode} holdout_log_loss={log_loss:.5f} holdout_auc={auc:.5f} "
              f"planted_log_loss={planted_ll:.5f} planted_auc={planted_auc:.5f} seconds={secs:.3f} "
              f"examples_per_sec={examples_per_sec:.0f} deep_rows={tables[DEEP_TABLE].rows} "
              f"wide_rows={tables[WIDE_TABLE].rows} "
              f"ids_filtered={sum(t.ids_filtered for t in tables.values())} "
              f"table_bytes={sum(t.bytes for t in tables.values())} "
              f"rows_expired={sum(t.rows_expired for t in tables.values())}", flush=True)
        if summaries:
            summaries.flush()
        session.end()  # the ps tasks exit once every worker has disconnected
    client.close()
    return 0


def main(argv):
    return cluster_flags.main("torch_ctr", parser(), check_flags, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
