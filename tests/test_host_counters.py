"""What a sandbox holds of the kernel's per-user counters is its own host uid's,
never host root's.

The kernel charges inotify instances and watches, queued signals, message queue
bytes, locked shared memory, processes and namespaces to the user of the
namespace a process is in, and then, level by level, to the owner of each user
namespace above it. A sandbox whose outermost user namespace host root made would
spend root's counters: 128 inotify instances from one kernel session used to leave
host root (and every other tenant's sandbox) with none. The sandbox's namespace is
made by its own host uid instead, and the counters the kernel keeps a limit for are
bounded per sandbox (rlimits). Each test holds everything a sandbox can take, then
shows host root and another tenant unaffected, with exact counts and errnos.
"""

import array
import fcntl
import json
import os
import signal
import ctypes
import errno

import pytest

from conftest import new_session
from test_pool import pooled_run
from test_security import PRELUDE, probe

NS_GET_PARENT = 0xB702
NS_GET_OWNER_UID = 0xB704
LIBC = ctypes.CDLL(None, use_errno=True)


def sysctl(name):
    return int(open(f"/proc/sys/{name}").read())


def root_inotify_instances():
    """How many inotify instances host root (this test, uid 0) can make now."""
    fds = []
    try:
        while True:
            fd = LIBC.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                assert ctypes.get_errno() == errno.EMFILE, os.strerror(ctypes.get_errno())
                return len(fds)
            fds.append(fd)
    finally:
        for fd in fds:
            os.close(fd)


def root_can_watch():
    fd = LIBC.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        wd = LIBC.inotify_add_watch(fd, b"/", 0x100)  # IN_CREATE
        return "ok" if wd >= 0 else errno.errorcode[ctypes.get_errno()]
    finally:
        os.close(fd)


def root_sigq():
    """Signals queued for host root now (the count half of /proc/self/status SigQ)."""
    for line in open("/proc/self/status"):
        if line.startswith("SigQ:"):
            return int(line.split()[1].split("/")[0])
    raise AssertionError("no SigQ")


def user_ns_owners(pid):
    """The owners of process `pid`'s user namespace and of each one above it, up to
    (not including) the host's."""
    host = os.stat("/proc/self/ns/user").st_ino
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    owners = []
    while os.fstat(fd).st_ino != host:
        uid = array.array("I", [0])
        fcntl.ioctl(fd, NS_GET_OWNER_UID, uid, True)
        owners.append(uid[0])
        parent = fcntl.ioctl(fd, NS_GET_PARENT)
        os.close(fd)
        fd = parent
    os.close(fd)
    return owners


def processes_of(uid):
    pids = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and int(open(f"/proc/{p}/status").read().split("Uid:")[1].split()[1]) == uid:
                pids.append(int(p))
        except (OSError, IndexError, ValueError):
            continue
    return pids


# A kernel cell that takes every inotify instance its uid may have, then every watch
# (each instance watching the same 1,600 files, as the attack did), and keeps them.
HOLD_INOTIFY = PRELUDE + r'''
import json
os.makedirs("/tmp/w", exist_ok=True)
files = []
for i in range(1600):
    p = f"/tmp/w/{i}".encode()
    open(p, "w").close()
    files.append(p)
held = []
while True:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        instances_errno = errno.errorcode[ctypes.get_errno()]
        break
    held.append(fd)
watches, watches_errno = 0, None
for fd in held:
    for p in files:
        if libc.inotify_add_watch(fd, p, 0x2) < 0:  # IN_MODIFY
            watches_errno = errno.errorcode[ctypes.get_errno()]
            break
        watches += 1
    if watches_errno:
        break
print(json.dumps({"instances": len(held), "instances_errno": instances_errno,
                  "watches": watches, "watches_errno": watches_errno}))
'''

# Queue real-time signals to its own thread until the kernel refuses one
# (rt_tgsigqueueinfo, unlike kill, fails with EAGAIN past the limit; thread-directed,
# so a kernel session's other threads, which do not block the signal, never take it).
QUEUE_SIGNALS = PRELUDE + r'''
import json, signal, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
info = (ctypes.c_int * 32)()
info[0], info[2] = signal.SIGRTMIN, -1  # si_signo, si_code = SI_QUEUE
queued = 0
while libc.syscall(ctypes.c_long(297), os.getpid(), threading.get_native_id(), int(signal.SIGRTMIN), info) == 0:
    queued += 1
sigq = open("/proc/self/status").read().split("SigQ:")[1].split()[0]
print(json.dumps({"queued": queued, "errno": errno.errorcode[ctypes.get_errno()], "sigq": sigq}))
'''


def test_a_sandbox_holding_every_inotify_instance_and_watch_leaves_host_root_and_others_theirs(daemon, kernel):
    max_instances = sysctl("fs/inotify/max_user_instances")
    max_watches = sysctl("fs/inotify/max_user_watches")
    root_before = root_inotify_instances()
    assert root_before > 0, "host root has no inotify instance left before the test: something else holds them"
    sid = kernel(ttl_s=600)
    # The kernel's own host uid: its session's, or its template's when it started in one.
    _, uid = daemon.kernel_process(sid)
    with daemon.http() as c:
        r = c.post("/v1/runs", json={"code": HOLD_INOTIFY, "session_id": sid, "timeout_s": 60}).json()
    assert r["status"] == "ok", r
    held = json.loads(r["stdout"].strip().splitlines()[-1])
    # The sandbox took everything its own uid may have: the per-user limits, exactly.
    assert held["instances"] == max_instances and held["instances_errno"] == "EMFILE", held
    assert held["watches"] == max_watches and held["watches_errno"] == "ENOSPC", held
    # It is charged to the sandbox's host uid: the owner of its outermost user namespace.
    kernel_pids = processes_of(uid)
    assert kernel_pids, "the kernel session's processes are not on the host"
    for pid in kernel_pids:
        try:
            owners = user_ns_owners(pid)
        except FileNotFoundError:
            continue
        assert owners and owners[-1] == uid and 0 not in owners, (pid, owners)
    # While it holds all that, host root keeps every instance it had, and its watches.
    assert root_inotify_instances() >= root_before - 2
    assert root_can_watch() == "ok"
    # So does another tenant's sandbox.
    with daemon.http() as c:
        other = new_session(c)
    out, _ = probe(daemon, r'''
import json
fd = libc.inotify_init1(0)
wd = libc.inotify_add_watch(fd, b"/tmp", 0x100) if fd >= 0 else -1
print(json.dumps({"fd": fd >= 0, "wd": wd >= 0}))
''', session_id=other)
    assert out == {"fd": True, "wd": True}, out


def test_queued_signals_are_bounded_per_sandbox_and_never_charged_to_host_root(daemon, kernel):
    before = root_sigq()
    sid = kernel(ttl_s=600)
    with daemon.http() as c:
        r = c.post("/v1/runs", json={"code": QUEUE_SIGNALS, "session_id": sid}).json()
    assert r["status"] == "ok", r
    held = json.loads(r["stdout"].strip().splitlines()[-1])
    # The sandbox's limit (RLIMIT_SIGPENDING), not the host's default of about 96,000.
    assert held == {"queued": 1024, "errno": "EAGAIN", "sigq": "1024/1024"}, held
    # The kernel keeps them queued; none is counted as host root's.
    assert root_sigq() - before < 512, (before, root_sigq())
    # Host root queues one to itself as ever.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
    try:
        value = ctypes.c_void_p(0)
        assert LIBC.sigqueue(os.getpid(), signal.SIGRTMIN, value) == 0, os.strerror(ctypes.get_errno())
        assert signal.sigtimedwait({signal.SIGRTMIN}, 1).si_signo == signal.SIGRTMIN
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    # A pooled run (a template's fork) has the same bound.
    with daemon.http() as c:
        pooled = new_session(c)
    r = pooled_run(daemon, QUEUE_SIGNALS, session_id=pooled)
    assert r["status"] == "ok", r
    assert json.loads(r["stdout"].strip().splitlines()[-1]) == {"queued": 1024, "errno": "EAGAIN", "sigq": "1024/1024"}


# Every other per-user (or host-wide) counter a sandbox could reach: closed by
# seccomp, or bounded by an rlimit of its own.
OTHER_COUNTERS = PRELUDE + r'''
import json, mmap
limits = {}
for line in open("/proc/self/limits").read().splitlines()[1:]:
    name = line[:26].strip()
    limits[name] = line[26:47].split()[0]
def shm_lock():
    shmid = libc.shmget(0, 1 << 20, 0o600 | 0o1000)  # IPC_PRIVATE, IPC_CREAT
    if shmid < 0:
        return errno.errorcode[ctypes.get_errno()]
    r = libc.shmctl(shmid, 11, None)  # SHM_LOCK
    e = ctypes.get_errno()
    libc.shmctl(shmid, 0, None)  # IPC_RMID
    return "ok" if r == 0 else errno.errorcode[e]
buf = mmap.mmap(-1, 1 << 20)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print(json.dumps({
    "limits": {k: limits[k] for k in ["Max pending signals", "Max msgqueue size", "Max locked memory",
                                      "Max realtime priority", "Max nice priority"]},
    "mq_open": sc(240, 0, 0, 0, 0),
    "fanotify_init": sc(300, 0, 0),
    "io_setup": sc(206, 1, ctypes.addressof(ctypes.c_ulong(0))),
    "io_submit": sc(209, 0, 0, 0),
    "mlock": "ok" if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(1 << 20)) == 0 else errno.errorcode[ctypes.get_errno()],
    "shm_lock": shm_lock(),
    "unshare_user": sc(272, 0x10000000),
}))
'''

BOUNDED = {
    "limits": {"Max pending signals": "1024", "Max msgqueue size": "0", "Max locked memory": "65536",
               "Max realtime priority": "0", "Max nice priority": "0"},
    # POSIX message queues, fanotify and Linux AIO (whose contexts count against one
    # host-wide limit, fs.aio-max-nr) are not in the seccomp allow-list.
    "mq_open": "EPERM",
    "fanotify_init": "EPERM",
    "io_setup": "EPERM",
    "io_submit": "EPERM",
    # Locking memory, directly or as SysV shared memory: past 64 KiB, the kernel refuses.
    "mlock": "ENOMEM",
    "shm_lock": "ENOMEM",
    "unshare_user": "EPERM",
}


@pytest.mark.parametrize("mode", ["pooled", "cold"])
def test_every_other_per_user_counter_is_closed_or_bounded(daemon, mode):
    if mode == "pooled":
        with daemon.http() as c:
            sid = new_session(c)
        r = pooled_run(daemon, OTHER_COUNTERS, session_id=sid)
    else:
        r = daemon.run("cat > /tmp/p.py <<'EOF'\n" + OTHER_COUNTERS + "\nEOF\n/opt/py/bin/python /tmp/p.py",
                       language="shell")
    assert r["status"] == "ok", r
    assert json.loads(r["stdout"].strip().splitlines()[-1]) == BOUNDED
