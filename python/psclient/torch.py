"""PyTorch modules whose parameters and embedding rows live on psd.

As horovod.torch and byteps.torch do for all-reduce: a torch.nn.Module's
parameters and an embedding table's rows are bound to a TrainingSession, so
that a step's pull lands in them and its push sends their gradients.

    import psclient, psclient.torch as pst

    session = psclient.TrainingSession(client, mode="async")
    params = pst.Parameters(session, model, optimizer=psclient.adam(1e-3))
    user = pst.Embedding(session, psclient.TableSpec("user", 16, dynamic=True))
    session.initialize()
    while not session.should_stop:
        user.set_ids(batch_user_ids)            # before the pull: the rows this step reads
        pst.pull(session, params, user)         # session.pull(), then the values onto the model's device
        if session.should_stop:
            break                               # a sync worker behind may find the job done at its pull
        loss = loss_fn(model(x, user.rows()), y)
        pst.backward(loss, params, user)        # zero the gradients, then loss.backward()
        pst.push(session, params, user)         # the gradients to where session.push() reads them, and push

Parameters binds named_parameters(): a frozen (requires_grad=False) or unused
parameter pushes zeros, which SGD leaves alone but momentum and Adam on psd
still move by their slots; buffers (BatchNorm's running statistics) stay on
each worker (Parameters warns). Convert the module (.to(), channels_last)
before binding it: afterwards a pull or push raises.

Between backward() and push() the gradients are PyTorch's to change
(torch.nn.utils.clip_grad_norm_(model.parameters(), ...), say). On the CPU
pulls land in the parameters themselves and backward adds into the buffers
push() reads: nothing is copied. On CUDA the values arrive in one pinned
host block and move to the device with one copy a step, and the gradients
come back with one.

Importing this module imports torch; `import psclient` alone does not.
"""

import warnings

import numpy as np
import torch

from ._psclient import StepOutcome, TableSpec, TensorSpec, TrainingSession, from_values, glorot_uniform, zeros


def _init_of(init, index, name, param, seed):
    """The InitConfig of one parameter (see Parameters' init)."""
    if init is None:
        if param.dim() == 2:  # a Linear's weight: Glorot-uniform, as the C++ trainers' matrices
            return glorot_uniform(seed + index)
        if param.dim() < 2 and name.rsplit(".", 1)[-1] == "bias":
            return zeros()
        # A convolution's weight (psd's Glorot fans are TensorFlow's layout), a norm layer's scale
        # (1), PReLU's slope (0.25): PyTorch's own values, which zeros would break.
        return from_values(param.detach().cpu().contiguous().numpy())
    if init == "module":
        return from_values(param.detach().cpu().contiguous().numpy())
    if callable(init):
        return init(index, name, param)
    raise ValueError(f"Parameters: init must be None, 'module' or a callable, not {init!r}")


class _HostCopy:
    """Waits, before pinned host memory is written again, for the copy to the device that reads it."""

    def __init__(self, device):
        self.device = device
        self.event = torch.cuda.Event() if device.type == "cuda" else None

    def started(self):
        if self.event is not None:
            # The copy was queued on the target device's stream, which need not be the current device's.
            self.event.record(torch.cuda.current_stream(self.device))

    def wait(self):
        if self.event is not None:
            self.event.synchronize()


class Parameters:
    """A module's parameters as variables of a TrainingSession, one per parameter, named prefix + name.

    optimizer: an OptimizerConfig (psclient.sgd(0.1), psclient.adam(1e-3), ...).
    init: None for Glorot-uniform 2-D weights (seeded seed + the parameter's index in
    module.named_parameters()), zeros for biases (parameters named "bias" of 0 or 1 dimensions) and
    PyTorch's own values for the rest (convolutions, norm layers' scales, PReLU's slopes); "module" for the values the module holds now (PyTorch's own
    initialization, or a trained model's); or a callable (index, name, parameter) -> InitConfig.
    The chief's initial values are the ones psd keeps. The parameters must be float32, all on one
    device, and are re-pointed at blocks this object holds (the module keeps working). Call before
    session.initialize().
    """

    def __init__(self, session: TrainingSession, module: torch.nn.Module, *, optimizer, prefix: str = "",
                 init=None, seed: int = 0):
        named = [(name, p) for name, p in module.named_parameters()]
        if not named:
            raise ValueError("Parameters: the module has no parameters")
        devices = {p.device for _, p in named}
        if len(devices) != 1:
            raise ValueError("Parameters: the module's parameters are on several devices "
                             f"({', '.join(sorted(map(str, devices)))})")
        taken = set(session.variable_names)
        for name, p in named:
            if p.dtype != torch.float32:
                raise ValueError(f"Parameters: '{prefix}{name}' is {p.dtype}; psd holds float32")
            if prefix + name in taken:
                raise ValueError(f"Parameters: the session already has a variable '{prefix}{name}' (another "
                                 "Parameters? give each its own prefix=); nothing was bound")
        buffers = [name for name, b in module.named_buffers() if b.is_floating_point()]
        if buffers:
            warnings.warn(f"Parameters: the module's buffers ({', '.join(buffers[:3])}"
                          f"{', ...' if len(buffers) > 3 else ''}) stay on each worker: psd holds parameters "
                          "only, so its checkpoints and other workers do not see them", stacklevel=2)
        self.device = devices.pop()
        self.cuda = self.device.type == "cuda"
        total = sum(p.numel() for _, p in named)
        # Blocks of every parameter in order: one zero_ call and (CUDA) one copy each way a step.
        self._host_grads = torch.zeros(total, pin_memory=self.cuda)
        if self.cuda:
            self._host_values = torch.empty(total, pin_memory=True)
            self._dev_values = torch.zeros(total, device=self.device)
            self._dev_grads = torch.zeros(total, device=self.device)
        self._copy = _HostCopy(self.device)
        # (psd's name, parameter, the view of the gradient block it backpropagates into, the address in
        # the value block it must keep)
        self._bound = []
        self._grad_block = self._dev_grads if self.cuda else self._host_grads  # backward adds into it
        self._zeroed = False  # the gradient block zeroed since the last pull
        self.values = {}  # psd's name -> the host tensor pulls land in (client.pull(params.values) works)
        at = 0
        for i, (name, p) in enumerate(named):
            part = slice(at, at + p.numel())
            at += p.numel()
            host_grads = self._host_grads[part].view(p.shape)
            spec = TensorSpec(prefix + name, tuple(p.shape), optimizer=optimizer,
                              init=_init_of(init, i, name, p, seed))
            with torch.no_grad():
                if self.cuda:
                    values = self._host_values[part].view(p.shape)
                    self._dev_values[part].view(p.shape).copy_(p)
                    p.data, grads = self._dev_values[part].view(p.shape), self._dev_grads[part].view(p.shape)
                else:
                    values = self._host_grads.new_empty(p.shape)
                    values.copy_(p)
                    p.data, grads = values, host_grads
            p.grad = grads
            self._bound.append((prefix + name, p, grads, p.data_ptr()))
            session.add_variable(spec, values, host_grads)
            self.values[prefix + name] = values

    def before_pull(self):
        self._copy.wait()  # the last step's values are on the device before the pull overwrites them

    def after_pull(self):
        """The pulled values onto the device (CUDA; on the CPU they already are the parameters), and the
        gradient block zeroed: a step that pushes without a backward (a skipped batch) pushes zeros, not
        the last step's gradients."""
        self._check_where()
        if self.cuda:
            self._dev_values.copy_(self._host_values, non_blocking=True)
            self._copy.started()
        self._grad_block.zero_()
        self._zeroed = True

    def zero_grad(self):
        """Zeroes the gradient block (once a step: after_pull did) and binds each parameter's .grad to
        its view of it again (a module.zero_grad() or optimizer.zero_grad() may have set them to None)."""
        for _, p, grads, _ in self._bound:
            if p.grad is not grads:
                p.grad = grads
        if not self._zeroed:
            self._grad_block.zero_()
        self._zeroed = False

    def _check_where(self):
        """Raises if a parameter no longer lives in the block pulls write and pushes read."""
        for name, p, _, ptr in self._bound:
            if p.data_ptr() != ptr:
                raise RuntimeError(f"Parameters: '{name}' has moved out of the memory psd's pulls write (the "
                                   "module converted after Parameters(): .to(), .cuda(), .half(), "
                                   "channels_last); convert the module first, then bind it")

    def before_push(self):
        """The gradients where push() reads them (CUDA: one copy to the host, which waits for backward).
        A parameter whose .grad is None (unused by this step's loss, after module.zero_grad()) pushes zeros."""
        self._check_where()
        self._zeroed = False
        for _, p, grads, _ in self._bound:
            if p.grad is None:
                grads.zero_()  # not last step's gradient, which a plain loss.backward() left in the block
            elif p.grad is not grads:
                grads.copy_(p.grad)  # a .grad PyTorch replaced since backward (clipped out of place, say)
        if self.cuda:
            self._host_grads.copy_(self._dev_grads)

    def pull(self, client, **kwargs):
        """The variables' values now, outside the session's steps (the final model): client.pull, then onto
        the device."""
        self.before_pull()
        result = client.pull(self.values, **kwargs)
        self.after_pull()
        return result


class Embedding:
    """An embedding table bound to a TrainingSession: each step pulls the rows of the ids set_ids() names
    and pushes their gradients.

    rows() gives them as a tensor of shape ids.shape + (dim,) on `device`, a leaf that autograd tracks;
    it holds this step's rows until the next pull (on the CPU it is the buffer pulls write). A repeated
    id's gradients are summed (the client sums them before sending, as IndexedSlices are). grad_scale
    multiplies the gradients pushed (on the CPU in place, in rows().grad): with a mean loss over a
    batch of B examples, grad_scale=B gives each row its examples' summed gradient, as per-row Adagrad
    and FTRL take them. Call before session.initialize().
    """

    def __init__(self, session: TrainingSession, spec: TableSpec, *, device=None, grad_scale: float = 1.0):
        self.spec, self.session = spec, session
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.grad_scale = float(grad_scale)
        self._ids = None
        self._host_rows = self._host_grads = self._rows = None
        self._copy = _HostCopy(self.device)
        self._pulled = False  # pulled and not yet pushed: the ids may not change
        session.add_table(spec)

    @property
    def table(self) -> str:
        return self.spec.name

    @property
    def dim(self) -> int:
        return self.spec.dim

    def set_ids(self, ids):
        """The ids of the next steps' rows (int64 or uint64, any shape; NumPy array or CPU tensor),
        copied. Before the pull, or after the push: between them, the push would send this step's
        gradients for other ids (RuntimeError). They stay set until set again."""
        if self._pulled:
            raise RuntimeError(f"Embedding '{self.table}': set_ids() between the pull and the push would "
                               "send this step's gradients for other ids; set the next batch's ids after "
                               "psclient.torch.push")
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        ids = np.asarray(ids)
        if ids.dtype not in (np.int64, np.uint64):
            raise ValueError(f"Embedding '{self.table}': ids must be int64 or uint64, not {ids.dtype}")
        self._copy.wait()  # the last rows are on the device before their buffer is let go or reused
        # A copy, held: the session reads it at the pull and the push; the caller's buffer may be refilled.
        self._ids = np.array(ids, order="C", copy=True)
        shape = self._ids.shape + (self.dim,)
        if self._host_rows is None or tuple(self._host_rows.shape) != shape:
            self._host_rows = torch.empty(shape, pin_memory=self.cuda)
            self._host_grads = torch.zeros(shape, pin_memory=self.cuda)
        self.session.set_rows(self.table, self._ids, self._host_rows, self._host_grads)
        self._rows = None

    def before_pull(self):
        if self._ids is None:
            raise RuntimeError(f"Embedding '{self.table}': set_ids() before the pull")
        self._copy.wait()

    def after_pull(self):
        """The pulled rows as a fresh leaf tensor on the device (rows() returns it)."""
        self._pulled = True
        if self.cuda:
            self._rows = self._host_rows.to(self.device, non_blocking=True).requires_grad_()
            self._copy.started()
        else:
            # The pulled rows themselves; backward adds into the buffer push() reads, zeroed here, so
            # that a plain loss.backward() (no psclient.torch.backward) adds this step's alone.
            self._host_grads.zero_()
            self._rows = self._host_rows.detach().requires_grad_()
            self._rows.grad = self._host_grads

    def rows(self):
        """The rows of the ids set, as pulled this step: a tensor of shape ids.shape + (dim,)."""
        if self._rows is None:
            if self.session.should_stop:
                raise RuntimeError(f"Embedding '{self.table}': no rows: the job stopped at the pull "
                                   "(check session.should_stop after psclient.torch.pull)")
            raise RuntimeError(f"Embedding '{self.table}': rows() before the pull (psclient.torch.pull)")
        return self._rows

    def zero_grad(self):
        if self._host_grads is not None:
            self._host_grads.zero_()
        if self._rows is not None:
            self._rows.grad = None if self.cuda else self._host_grads

    def before_push(self):
        """The rows' gradients (times grad_scale) where push() reads them."""
        self._pulled = False
        if self._rows is None:
            return  # no rows this step: zeros are pushed
        g = self._rows.grad
        if g is None:
            self._host_grads.zero_()  # the rows were not used by this step's loss: zeros are pushed
        elif g is not self._host_grads:
            self._host_grads.copy_(g)  # CUDA, or a .grad PyTorch replaced since backward
        if self.grad_scale != 1.0:
            self._host_grads.mul_(self.grad_scale)

    def lookup(self, client, ids):
        """The rows of `ids` as the table holds them now, creating none (evaluation, serving):
        client.lookup_rows, as a tensor of shape ids.shape + (dim,) on the device."""
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        out = torch.from_numpy(client.lookup_rows(self.table, np.ascontiguousarray(ids)))
        return out.to(self.device) if self.cuda else out


def pull(session: TrainingSession, *bound) -> int:
    """session.pull(), then each of `bound` (Parameters, Embedding) readied for the forward pass.
    Returns the step pulled at."""
    for b in bound:
        b.before_pull()
    step = session.pull()
    if not session.should_stop:
        for b in bound:
            b.after_pull()
    return step


def backward(loss: torch.Tensor, *bound):
    """Zeroes the gradients of `bound` (Parameters, Embedding), then runs loss.backward()."""
    for b in bound:
        b.zero_grad()
    loss.backward()


def push(session: TrainingSession, *bound) -> StepOutcome:
    """Puts the gradients of `bound` where session.push() reads them (CUDA: to the host; rows times their
    grad_scale), then session.push()."""
    for b in bound:
        b.before_push()
    return session.push()
