# A PyTorch DDP rank that records what it finds at its start (tests/integration/51-warm.bats),
# to compare a rank started warm with one started cold: argv, __name__, sys.path[0], the working
# folder, the environment, signals, stdio, threads, what was imported before its first line.
# argv[1] is the mode: "behave" (3 rounds, each ending another way) or "stacks" (round 1 waits).
import os
import sys

PRE = sorted(m for m in ('torch', 'numpy', 'warm_cudastub') if m in sys.modules)

import glob  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ROUND_VARS = {'RANK', 'WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE', 'ROLE_RANK',
              'ROLE_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RESTART_COUNT',
              'DDPRUN_STORE_ADDR', 'DDPRUN_NODE_ADDR', 'DDPRUN_TOKEN_FD', 'DDPRUN_PROGRESS_FD',
              'TORCHELASTIC_ERROR_FILE'}


def warm_siblings():
    """The warm interpreters beside this rank (children of its agent, named ddprun-warm)."""
    pp, n = os.getppid(), 0
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % p) as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            with open('/proc/%s/comm' % p) as f:
                n += ppid == pp and f.read().strip() == 'ddprun-warm'
        except (OSError, ValueError, IndexError):
            pass
    return n


def record(rnd, rank):
    tasks = os.listdir('/proc/self/task')
    out = {
        'pre': PRE,
        'argv': sys.argv, 'orig_argv': getattr(sys, 'orig_argv', None), 'name': __name__,
        'file': __file__, 'path0': sys.path[0], 'cwd': os.getcwd(), 'flags': str(sys.flags),
        'env': {k: v for k, v in os.environ.items() if k not in ROUND_VARS},
        'sigint': str(signal.getsignal(signal.SIGINT)),
        'sigterm': str(signal.getsignal(signal.SIGTERM)),
        'stdout': [type(sys.stdout).__name__, sys.stdout.line_buffering, sys.stdout.write_through,
                   sys.stdout.encoding, os.isatty(1)],
        'stdin': os.path.realpath('/proc/self/fd/0'),
        'threads': sorted(t.name for t in threading.enumerate()),
        'sched': sorted(os.sched_getscheduler(int(t)) for t in tasks),
        'nice': os.nice(0), 'umask': os.umask(0o22),
        'pgrp_is_parents': os.getpgrp() == os.getpgid(os.getppid()),
        'comm': open('/proc/self/comm').read(),
        'cpus': sorted(os.sched_getaffinity(0)),
        'hash': hash('ddprun'),
    }
    with open('%s/out-%d-%d.json' % (os.environ['OUT'], rnd, rank), 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)


def waiting_warm():
    while True:
        time.sleep(0.2)


def first_collective_recorded(rnd):
    """The launcher recorded round rnd's first collective (the last phase of the recovery into it)
    in the job's events (its logs folder under the working folder)."""
    for path in glob.glob('logs/*/events.jsonl'):
        with open(path) as f:
            for line in f:
                if '"event": "first_collective"' in line and '"round": %d,' % rnd in line:
                    return True
    return False


def main():
    mode = sys.argv[1]
    rnd, rank = int(os.environ['TORCHELASTIC_RESTART_COUNT']), int(os.environ['RANK'])
    dist.init_process_group('gloo')
    t = torch.ones(1)
    dist.all_reduce(t)
    record(rnd, rank)
    print('round %d rank %d: argv %s, sum %.0f' % (rnd, rank, sys.argv[1:], t.item()))
    print('round %d rank %d on stderr' % (rnd, rank), file=sys.stderr)
    if mode == 'stacks' and rnd == 1:
        waiting_warm()
    if os.environ.get('WAIT_WARM') == '1' and rnd < 2:
        t0 = time.time()  # the next round starts warm in both slots
        while warm_siblings() < 2 and time.time() - t0 < 60:
            time.sleep(0.05)
    if os.environ.get('WAIT_RECORDED') == '1' and rnd < 2:
        t0 = time.time()  # the round's recovery has all its phases before the round fails
        while not first_collective_recorded(rnd) and time.time() - t0 < 60:
            time.sleep(0.05)
    while os.environ.get('WAIT_FILE') and not os.path.exists(os.environ['WAIT_FILE']):
        time.sleep(0.05)
    if rank == 1:
        if rnd == 0:
            sys.exit(3)
        if rnd == 1:
            raise ValueError('boom in round %d' % rnd)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    if rnd == 1:
        def on_term(sig, frame):
            print('rank 0: SIGTERM in round 1', flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
    time.sleep(60)


if __name__ == '__main__':
    main()
