"""psclient: the client of the psd parameter server, for NumPy and PyTorch trainers.

    import numpy as np
    import psclient

    with psclient.Client(["127.0.0.1:2222"]) as client:
        client.create([psclient.TensorSpec("w", (2, 2), optimizer=psclient.sgd(0.1))])
        w = np.zeros((2, 2), np.float32)
        client.pull("w", w)                              # in place: w == 0
        client.push("w", np.ones((2, 2), np.float32))    # on psd: w -= 0.1 * grad
        client.pull({"w": w})                            # w == -0.1

Arrays are any C-contiguous float32 buffer: NumPy arrays, PyTorch CPU tensors
(module parameters included), anything with the buffer protocol or
__dlpack__. Calls that wait on the network release the GIL. *_async calls
return a concurrent.futures.Future (asyncio.wrap_future works on it).

Errors: psclient.Error, with ConnectionError, RequestError, ConfigError and CheckpointError
under it; arrays of the wrong dtype, layout or size raise ValueError before
anything is sent.

Embedding tables: client.create_tables([psclient.TableSpec("user", 16, rows=1000)]),
then client.pull_rows("user", ids, out) / client.push_rows("user", ids, grads)
with int64 (or uint64) ids. Click-through data as ctr_trainer reads it:
psclient.read_ctr(path) (or one worker's share, read_ctr_share) and
psclient.ctr_synthetic(n), with roc_auc and log_loss. A trained model from
psd's checkpoints, as NumPy arrays: psclient.load_checkpoint(dir).
PyTorch models: import psclient.torch binds a torch.nn.Module's parameters
and embedding tables' rows to a TrainingSession. See docs/python.md.
"""

from ._psclient import (
    Checkpoint,
    CheckpointError,
    CtrShareStream,
    Client,
    ClusterSpec,
    ConfigError,
    ConnectionError,
    Error,
    InitConfig,
    InitKind,
    JobConfig,
    LrSchedule,
    OptimizerConfig,
    OptimizerKind,
    PullResult,
    PushResult,
    PushStatus,
    RequestError,
    RestoredModel,
    RestoredTable,
    RowOptimizerConfig,
    RowOptimizerKind,
    ShardStats,
    StepDone,
    StepOutcome,
    SummaryWriter,
    SyncMode,
    TableInfo,
    TableSpec,
    TensorInfo,
    TensorSpec,
    TrainingSession,
    WorkerStats,
    adagrad,
    adam,
    constant,
    ctr_synthetic,
    dedup_ids,
    from_values,
    glorot_normal,
    glorot_uniform,
    load_checkpoint,
    log_loss,
    momentum,
    normal,
    optimizer,
    read_ctr,
    read_ctr_share,
    rmsprop,
    roc_auc,
    sgd,
    truncated_normal,
    uniform,
    zeros,
)

__all__ = [name for name in dir() if not name.startswith("_")]
