# ddprun: a warm interpreter (cli/agent/warm.h). The node agent started this process as a rank
# of the next round would be started, with its command line, environment, CPUs and workdir, but
# with the round's own variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) unset and its output going
# nowhere. ddprun's sitecustomize calls main() from the site import, before Python runs the
# program: it imports the modules the job named, at idle priority, says it is ready and waits.
# When the agent starts a rank in this slot it sends the round's variables; main() sets them,
# gives the process its output pipes and its signals back, and returns: Python then runs the
# program exactly as it would have at a cold start (sys.argv, __main__, sys.path[0],
# tracebacks). Anything going wrong here ends the process (126) rather than run the program.


def _idle_ok(os, threading):
    # Whether a thread made idle can be made normal again (root, CAP_SYS_NICE, or RLIMIT_NICE
    # of 20): the imports' own threads (OpenMP, BLAS) inherit the policy and must not keep it.
    box = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            box.append(True)
        except OSError:
            pass

    t = threading.Thread(name='ddprun-warm', target=probe)
    t.start()
    t.join()
    return bool(box)


def _import_all(os, sys, threading, imports, listed):
    notes = []
    idle = _idle_ok(os, threading)
    failed = []

    def work():
        if idle:
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                pass
        for name in imports:
            try:
                __import__(name)
            except BaseException:
                failed.append(name)

    t = threading.Thread(name='ddprun-warm', target=work)
    t.start()
    t.join()
    for name in failed:
        # a module that cannot be imported off the main thread gets a second try on it
        try:
            __import__(name)
        except BaseException as e:
            if listed:
                text = ('%s: %s' % (type(e).__name__, e)).replace('\n', ' ')[:300]
                notes.append('failed %s: %s' % (name, text))
    if idle:
        for tid in os.listdir('/proc/self/task'):
            try:
                if os.sched_getscheduler(int(tid)) == os.SCHED_IDLE:
                    os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
            except ProcessLookupError:
                pass  # a thread that ended meanwhile
            except OSError:
                notes.append('idle')
    return notes


def _cuda(os, sys):
    """Whether CUDA was initialised here, or libcuda loaded by something not known to leave it so.
    cuInit opens the driver's device files (/dev/nvidiactl, ...), whoever calls it. A CUDA build
    of torch maps libcuda at import without initialising it (measured: torch 2.11+cu130 on an
    H200), as a cold start's import does too; libcuda mapped with no such torch is a module's
    own doing, which may have initialised it where no device file shows it."""
    try:
        for fd in os.listdir('/proc/self/fd'):
            try:
                if os.readlink('/proc/self/fd/' + fd).startswith('/dev/nvidia'):
                    return True
            except OSError:
                pass  # closed meanwhile (the listing's own)
        t = sys.modules.get('torch')
        if t is not None and t.cuda.is_initialized():
            return True
        with open('/proc/self/maps') as f:
            mapped = any('libcuda.so' in line for line in f)
        return mapped and not (t is not None and getattr(t.version, 'cuda', None))
    except Exception:
        return False


def _comm(os, name=None):
    try:
        if name is None:
            with open('/proc/self/comm') as f:
                return f.read().rstrip('\n')
        with open('/proc/self/comm', 'w') as f:
            f.write(name)
    except OSError:
        pass
    return None


def main(spec, imports, listed):
    import os
    import signal
    import sys
    import threading  # on the main thread, as the program's own first import makes it

    ctl, out, err = (int(x) for x in spec.split(',')[:3])
    sint, sterm = spec.split(',')[3:5]
    names = [m for m in imports.split(',') if m]
    notes = _import_all(os, sys, threading, names, listed)
    if _cuda(os, sys):
        notes.append('cuda')
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    comm = _comm(os)
    _comm(os, 'ddprun-warm')
    os.write(ctl, ('ready\n' + ''.join(n + '\n' for n in notes)).encode())
    msg = os.read(ctl, 1 << 20)
    if not msg.startswith(b'go\0'):
        os._exit(0)  # the agent let this slot go
    for it in msg[3:].split(b'\0'):
        k, eq, v = it.partition(b'=')
        if it.startswith(b'@'):
            try:
                os.chdir(it[1:])
            except OSError as e:
                os.write(ctl, b'err 1 %d' % e.errno)
                os._exit(127)
        elif it.startswith(b'-'):
            os.environb.pop(it[1:], None)
        elif eq:
            os.environb[k] = v
    if comm is not None:
        _comm(os, comm)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    signal.signal(signal.SIGINT, signal.default_int_handler if sint == 'D' else signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL if sterm == 'D' else signal.SIG_IGN)
    os.write(ctl, b'ok')
    os.close(ctl)
