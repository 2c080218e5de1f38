# ddprun's flight recorder for PyTorch ranks (cli/diag/torch_rec.py; see cli/diag/pystacks.h).
#
# libddp's process groups write each collective into the rank's progress page, which the node
# agent reads on every heartbeat (common/progress.h); torch's do not. This module, loaded by
# the rank's sitecustomize when torch.distributed is imported, writes the same page from
# Python: each collective a program calls through torch.distributed on a group of every rank
# (all_reduce, broadcast, barrier, the *_object ones, ...), and each forward of a
# DistributedDataParallel module over every rank as a "ddp_step" (its backward's gradient
# all-reduces run in C++: the step begins when the rank's gradients are ready and ends after
# DDP's wait for them, else at the rank's next entry). So the
# launcher's hang report, `ddprun status` and stragglers see PyTorch ranks as they see libddp
# ones. It never changes what torch does, and a failure of its own leaves torch alone.
#
# ddprun prepends _L: the page's layout and the operations' codes, from common/progress.h.
# On the host (Gloo) a collective is finished when its call returns, or one called with
# async_op=True when that call returns. On a GPU (NCCL) a call returns once its work is
# queued: a collective on CUDA tensors, and a DDP step of a module on a GPU, are finished when
# the device gets past them (a CUDA event after them, or the async work, polled by a thread of
# the recorder's own), so a rank whose NCCL collective never ends shows in it.

import atexit
import mmap
import os
import sys
import threading
import time
import weakref

_mono = time.monotonic_ns
# The page's fields as indexes of its u64, u32 and byte views (the calls below use them often).
_ENT, _ESZ, _RING = _L['ent'], _L['esz'], _L['ring']
_Q_ENTERED, _Q_STARTED = _L['entered'] // 8, _L['started'] // 8
_Q_COMPLETED, _Q_CHANGED = _L['completed'] // 8, _L['changed'] // 8

# A collective's payload: the first of these parameters it has (this rank's input).
_PAYLOAD = ('input', 'input_tensor', 'input_list', 'input_tensor_list', 'tensor', 'tensors',
            'tensor_list')
_OPS = {
    'all_reduce': 'allreduce', 'all_reduce_coalesced': 'allreduce', 'broadcast': 'broadcast',
    'broadcast_object_list': 'broadcast', 'all_gather': 'allgather',
    'all_gather_into_tensor': 'allgather', '_all_gather_base': 'allgather',
    'all_gather_coalesced': 'allgather', 'all_gather_object': 'allgather',
    'reduce_scatter': 'reduce_scatter', 'reduce_scatter_tensor': 'reduce_scatter',
    '_reduce_scatter_base': 'reduce_scatter', 'barrier': 'barrier',
    'monitored_barrier': 'barrier', 'reduce': 'reduce', 'gather': 'gather',
    'gather_object': 'gather', 'scatter': 'scatter', 'scatter_object_list': 'scatter',
    'all_to_all': 'alltoall', 'all_to_all_single': 'alltoall',
}


class _Rec:
    def __init__(self):
        self.lock = threading.Lock()
        self.tls = threading.local()
        self.q = None      # the page as u64, u32 and bytes, once attached
        self.off = False   # nothing more to do in this process
        self.n = 0         # the last seq entered
        self.open = 0      # a ddp_step not finished yet
        self.c10d = None
        self.dtypes = None
        self.bytes = weakref.WeakKeyDictionary()  # DDP module -> its gradients' bytes, dtype, GPU
        self.hooked = weakref.WeakKeyDictionary()  # DDP modules whose first parameter is hooked
        self.pending = 0   # a ddp_step whose gradients are not ready yet
        self.pending_dev = None  # its module's device when a GPU
        self.gpu = []      # (seq, event or work, GPU of an event) still running on a device
        self.gpu_cv = threading.Condition()
        self.poller = None
        self.free = {}     # GPU -> events of the recorder's own the device has passed
        self.streams = {}  # a stream's identity -> torch's object for it

    # ---- the page ----

    def attach(self):
        """Maps the agent's page once the default group exists; False when it cannot."""
        c = self.c10d
        if self.off or c is None or not c.is_initialized():
            return False
        self.off = True
        if tuple(_L[k] for k in ('e_op', 'e_dtype', 'e_bucket', 'e_bytes', 'e_enq', 'e_start',
                                 'e_end', 'e_result')) != (8, 9, 12, 16, 24, 32, 40, 48):
            return False   # enter() writes an entry's fields at these offsets
        fd = int(os.environ.get('DDPRUN_PROGRESS_FD', '-1'))
        if fd < 0 or not os.readlink('/proc/self/fd/%d' % fd).startswith('/memfd:ddprun-progress'):
            return False
        m = mmap.mmap(fd, _L['size'])
        q, i, b = memoryview(m).cast('Q'), memoryview(m).cast('I'), memoryview(m).cast('B')
        if i[_L['attached'] // 4]:
            return False   # a libddp group of this process writes it
        i[_L['attached'] // 4] = 1
        for k in ('entered', 'started', 'completed'):
            q[_L[k] // 8] = 0
        ent, esz = _L['ent'], _L['esz']
        for k in range(_L['ring']):
            q[(ent + k * esz) // 8] = 0
        i[_L['magic'] // 4] = _L['MAGIC']
        i[_L['version'] // 4] = _L['VERSION']
        i[_L['ring_n'] // 4] = _L['ring']
        i[_L['rank'] // 4] = c.get_rank() & 0xffffffff
        i[_L['world'] // 4] = c.get_world_size() & 0xffffffff
        q[_L['changed'] // 8] = q[_L['attached_ns'] // 8] = _mono()
        self.m, self.q, self.i, self.b = m, q, i, b
        torch = sys.modules.get('torch')
        self.dtypes = {getattr(torch, n): v for n, v in _L['dtypes'].items()
                       if hasattr(torch, n)}
        self.off = False
        return True

    def enter(self, op, nbytes, dtype, started=True):
        """Writes entry seq (the next); closes an open ddp_step first. Under self.lock."""
        q, i, b = self.q, self.i, self.b
        t = _mono()
        if self.open:
            self.end_locked(self.open, 0, t, timed=False)
            self.open = 0
        s = self.n + 1
        self.n = s
        e = _ENT + (s % _RING) * _ESZ
        e8, e4 = e >> 3, e >> 2
        q[e8] = 0   # seq: 0 while the entry is rewritten, then s (common/progress.h)
        b[e + 8] = op
        b[e + 9] = dtype
        i[e4 + 3] = 0xffffffff   # bucket -1
        q[e8 + 2] = nbytes
        q[e8 + 3] = t   # issued
        q[e8 + 4] = t if started else 0   # began
        q[e8 + 5] = 0   # finished
        i[e4 + 12] = 0  # result
        q[e8] = s
        q[_Q_ENTERED] = s
        if started:
            q[_Q_STARTED] = s
        q[_Q_CHANGED] = t
        return s

    def start_locked(self, s, t):
        q = self.q
        e = _ENT + (s % _RING) * _ESZ
        if q[e >> 3] == s:
            q[(e >> 3) + 4] = t
        q[_Q_STARTED] = s
        q[_Q_CHANGED] = t

    def end_locked(self, s, failed, t, timed=True):
        """Finishes entry s; a step closed by the rank's next entry (timed False) keeps no
        begin time: its length says nothing of when the rank arrived."""
        q = self.q
        e = _ENT + (s % _RING) * _ESZ
        if q[e >> 3] == s:
            if failed:
                self.i[(e >> 2) + 12] = 1
            if not timed:
                q[(e >> 3) + 4] = 0
            q[(e >> 3) + 5] = t
        if s > q[_Q_COMPLETED]:   # an entry a device ran may end after a later one
            q[_Q_COMPLETED] = s
        q[_Q_CHANGED] = t

    def end(self, s, failed):
        try:
            with self.lock:
                if self.q is not None:
                    self.end_locked(s, failed, _mono())
        except Exception:
            pass

    def close_step(self):
        try:
            with self.lock:
                if self.q is not None and self.open:
                    self.end_locked(self.open, 0, _mono(), timed=False)
                    self.open = 0
        except Exception:
            pass

    # ---- what is recorded ----

    def whole(self, g):
        """Whether group g has every rank (its collectives are in every rank's sequence)."""
        c = self.c10d
        return g is None or g is c.GroupMember.WORLD or c.get_world_size(g) == c.get_world_size()

    def size_of(self, x):
        """(bytes, dtype code, a CUDA tensor of x or None)."""
        torch = sys.modules.get('torch')
        if isinstance(x, torch.Tensor):
            return (x.numel() * x.element_size(), self.dtypes.get(x.dtype, 255),
                    x if x.is_cuda else None)
        if isinstance(x, (list, tuple)):
            n, dt, dev = 0, 255, None
            for t in x:
                if isinstance(t, torch.Tensor):
                    n += t.numel() * t.element_size()
                    dt = self.dtypes.get(t.dtype, 255)
                    if dev is None and t.is_cuda:
                        dev = t
            return n, dt, dev
        return 0, 255, None

    def coll(self, op, gi, pi, pname, a, k):
        """Enters a collective called with (a, k): (its seq, a CUDA tensor of its payload or
        None), seq 0 when not recorded."""
        try:
            if self.off or (self.q is None and not self.attach()):
                return 0, None
            g = k.get('group') if 'group' in k else (a[gi] if gi is not None and gi < len(a)
                                                     else None)
            if not self.whole(g):
                return 0, None
            x = k.get(pname) if pname in k else (a[pi] if pi is not None and pi < len(a)
                                                 else None)
            nbytes, dt, dev = self.size_of(x) if x is not None else (0, 255, None)
            with self.lock:
                return self.enter(op, nbytes, dt), dev
        except Exception:
            return 0, None

    # ---- work a device still runs ----

    def finish(self, s, dev, r):
        """Ends entry s, whose call returned r: now, or for a payload on a GPU (dev, one of
        its tensors) once the device has run it."""
        if dev is None or not self.on_device(s, dev.device, r):
            self.end(s, 0)

    def on_device(self, s, device, r):
        """Tracks s until the device gets past it: the async work r, else an event queued
        on the device's current stream (which a blocking call made wait for the collective).
        False when it cannot be tracked."""
        try:
            with self.gpu_cv:
                if hasattr(r, 'is_completed'):
                    probe, idx = r, None
                else:
                    idx = device.index
                    probe = self.event(idx)
                    if probe is None:
                        return False
                self.gpu.append((s, probe, idx))
                if self.poller is None:
                    self.poller = threading.Thread(target=self.poll, daemon=True,
                                                   name='ddprun-flight-recorder')
                    self.poller.start()
                if len(self.gpu) == 1:
                    self.gpu_cv.notify()   # the poller waits only while nothing is tracked
            return True
        except Exception:
            return False

    def event(self, idx):
        """A CUDA event recorded on GPU idx's current stream, None during a CUDA graph's
        capture (nothing runs now). Under self.gpu_cv. Per call, torch's public way costs tens
        of us in Python (a new Event, a new Stream object), so the events are the recorder's
        own, reused once the device has passed them, and each stream's object is kept."""
        torch = sys.modules['torch']
        C = torch._C
        if C._cuda_isCurrentStreamCapturing():
            return None
        key = C._cuda_getCurrentStream(idx)   # the stream's identity (a tuple, an int in 1.x)
        st = self.streams.get(key)
        if st is None:
            if len(self.streams) > 64:
                self.streams.clear()
            st = self.streams[key] = torch.cuda.current_stream(idx)
        free = self.free.get(idx)
        ev = free.pop() if free else torch.cuda.Event()
        ev.record(st)
        return ev

    def poll(self):
        """The recorder's thread: ends each tracked entry once its device has run it. It looks
        every 10 ms while anything is tracked, not at each call: a wake-up per call would take
        the GIL from the rank's own thread for every small collective. So an entry's end is
        known to within 10 ms."""
        while True:
            with self.gpu_cv:
                while not self.gpu:
                    self.gpu_cv.wait()
            time.sleep(0.01)
            with self.gpu_cv:
                items = list(self.gpu)
            done = []
            for s, p, idx in items:
                try:
                    ok = p.query() if idx is not None else p.is_completed()
                    failed = 0
                except Exception:
                    ok, failed = True, 1   # a CUDA error, a failed work: it ended, failing
                if ok:
                    done.append((s, p, idx, failed))
            for s, _, _, failed in done:
                self.end(s, failed)
            if done:
                ended = set(s for s, _, _, _ in done)
                with self.gpu_cv:
                    self.gpu = [x for x in self.gpu if x[0] not in ended]
                    for _, p, idx, failed in done:
                        free = self.free.setdefault(idx, []) if idx is not None else None
                        if free is not None and not failed and len(free) < 256:
                            free.append(p)

    # A DDP step's times: issued at its forward; begun when its first parameter's gradient is
    # computed (the backward's last: the rank's gradients are ready, it arrives at the
    # all-reduce); finished after the backward's final callbacks, DDP's wait for its gradient
    # all-reduces among them. As for a collective, the rank that arrives last waits shortest.

    def grad_ready(self, grad):
        """The hook on a DDP module's first parameter: the step has begun; times its end."""
        try:
            s = self.pending
            if s and self.q is not None:
                self.pending = 0
                with self.lock:
                    if self.open == s:
                        self.start_locked(s, _mono())
                eng = sys.modules['torch'].autograd.Variable._execution_engine
                # queued from a final callback, the second runs after those queued meanwhile
                # (DDP's, when its last bucket is ready)
                dev = self.pending_dev
                eng.queue_callback(lambda: eng.queue_callback(lambda: self.step_done(s, dev)))
        except Exception:
            pass
        return None

    def step_done(self, s, dev):
        """After DDP's wait for its all-reduces: a step on the host has ended; on a GPU (dev)
        that wait only queued the device's, and the step ends once the device has run it."""
        try:
            with self.lock:
                if self.q is None or self.open != s:
                    return
                self.open = 0
                if dev is None or not self.on_device(s, dev, None):
                    self.end_locked(s, 0, _mono())
        except Exception:
            pass

    def hook(self, ddp):
        """A hook on the first parameter that takes a gradient, once per DDP module."""
        if ddp in self.hooked:
            return
        self.hooked[ddp] = True
        for p in ddp.module.parameters():
            if p.requires_grad:
                p.register_hook(self.grad_ready)
                return

    def step(self, ddp):
        """A DistributedDataParallel forward: enters a ddp_step (or ddp_forward) left open."""
        try:
            if self.off or (self.q is None and not self.attach()):
                return
            if not self.whole(getattr(ddp, 'process_group', None)):
                return
            torch = sys.modules.get('torch')
            sync = torch.is_grad_enabled() and getattr(ddp, 'require_backward_grad_sync', True)
            nb = self.bytes.get(ddp)
            if nb is None:
                n, dt, dev = self.size_of([p for p in ddp.module.parameters() if p.requires_grad])
                nb = self.bytes[ddp] = (n, dt, dev.device if dev is not None else None)
            op = _L['ops']['ddp_step' if sync else 'ddp_forward']
            if sync:
                self.hook(ddp)
            with self.lock:
                self.open = self.enter(op, nb[0], nb[1], started=not sync)
            self.pending = self.open if sync else 0
            self.pending_dev = nb[2]
        except Exception:
            pass


_R = _Rec()


def _wrap(fn, op, gi, pi, pname):
    # named for the tracebacks it shows in: torch's function, called by ddprun's recorder
    def ddprun_flight_recorder(*a, **k):
        t = _R.tls
        if getattr(t, 'busy', False):
            return fn(*a, **k)   # inside a recorded call (all_gather_object's all_gathers)
        s, dev = _R.coll(op, gi, pi, pname, a, k)
        if not s:
            return fn(*a, **k)
        t.busy = True
        try:
            r = fn(*a, **k)
        except BaseException:
            t.busy = False
            _R.end(s, 1)
            raise
        t.busy = False
        _R.finish(s, dev, r)
        return r
    for k in ('__module__', '__name__', '__qualname__', '__doc__'):
        try:
            setattr(ddprun_flight_recorder, k, getattr(fn, k))
        except Exception:
            pass
    ddprun_flight_recorder.__dict__.update(getattr(fn, '__dict__', {}))
    ddprun_flight_recorder.__wrapped__ = fn   # torch's function itself (its own __wrapped__ under)
    return ddprun_flight_recorder


def _patch_c10d(c):
    import inspect
    _R.c10d = c
    for name, opname in _OPS.items():
        fn = getattr(c, name, None)
        if fn is None or not callable(fn):
            continue
        try:
            ps = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        gi = ps.index('group') if 'group' in ps else None
        pname = next((p for p in _PAYLOAD if p in ps), None)
        pi = ps.index(pname) if pname else None
        setattr(c, name, _wrap(fn, _L['ops'][opname], gi, pi, pname))
    init = getattr(c, 'init_process_group', None)
    if init is not None:
        def init_process_group(*a, **k):
            r = init(*a, **k)
            try:   # a rank that has recorded nothing yet counts from here: 0 entered
                if _R.q is None:
                    _R.attach()
            except Exception:
                pass
            return r
        init_process_group.__wrapped__ = init
        init_process_group.__doc__ = init.__doc__
        c.init_process_group = init_process_group
    destroy = getattr(c, 'destroy_process_group', None)
    if destroy is not None:
        def destroy_process_group(*a, **k):
            _R.close_step()
            return destroy(*a, **k)
        destroy_process_group.__wrapped__ = destroy
        destroy_process_group.__doc__ = destroy.__doc__
        c.destroy_process_group = destroy_process_group
    atexit.register(_R.close_step)
    if hasattr(os, 'register_at_fork'):
        os.register_at_fork(after_in_child=_forked)


def _forked():
    _R.off = True   # a child of the rank shares its page: only the rank writes it
    _R.q = None


def _patch_ddp(mod):
    cls = getattr(mod, 'DistributedDataParallel', None)
    fwd = getattr(cls, 'forward', None)
    if fwd is None:
        return

    def ddprun_flight_recorder(self, *a, **k):
        _R.step(self)
        t = _R.tls
        if getattr(t, 'busy', False):
            return fwd(self, *a, **k)
        t.busy = True   # collectives inside the forward are part of the step
        try:
            return fwd(self, *a, **k)
        finally:
            t.busy = False
    ddprun_flight_recorder.__name__ = ddprun_flight_recorder.__qualname__ = 'forward'
    ddprun_flight_recorder.__wrapped__ = fwd
    ddprun_flight_recorder.__doc__ = fwd.__doc__
    cls.forward = ddprun_flight_recorder


def patch(name, module):
    if name == 'torch.distributed.distributed_c10d':
        _patch_c10d(module)
    elif name == 'torch.nn.parallel.distributed':
        _patch_ddp(module)
