"""Runs one run of user code inside a sandbox: a script run, or a pooled run.

Script mode. Started by sandboxd as `/opt/py/bin/python /opt/sandboxd/runner.py
RUN_ID AUTOSAVE` (runner.py only imports this module and calls main()). The code
arrives on stdin; stdin is then pointed at /dev/null so the user's code sees an
empty stdin. The process's exit status is the run's exit code.

Pooled mode. A template is started ahead of its runs as `runner.py --template
MODULES`, with a socket to the daemon as stdin. The messages are the typed ones of
sandboxd/src/isolate/message.rs (JSON, one per line or datagram; names below are
its types), and their bytes must stay what its round-trip tests pin:

  template socket (this process's stdin):
    -> TemplateMessage::Ready   `{"ready": {"failed": [MODULE, ...]}}` once MODULES
                                (comma-separated) are imported, those in `failed` not
    <- ForkRequest              `{"spec": ChildSpec}` with ForkFds (SCM_RIGHTS, in
                                order: library, stdout, stderr, socket, report): fork
                                once; the fork hands `spec` to `sandboxd_enter`
    -> TemplateMessage::Reaped  `{"reaped": PID}`: that fork is gone
  a run's socket (ForkFds.socket, in the fork):
    -> ForkMessage::Entered     `{"entered": true}`: in its own sandbox, no code yet
    <- RunCode                  `{"code", "run_id", "autosave", "env"}` (the workspace,
                                and the session's package layer if it has one, are
                                mounted by then): sets `env` (an object of
                                NAME -> VALUE: the session's secrets' placeholders)
                                in os.environ, puts the layer on sys.path, runs the
                                code once. With `"kernel": true`, `code` is kernel.py:
                                the fork becomes a kernel session's kernel, the socket
                                its channel (kernel.py's protocol from here on), and
                                it sends no RunClaim
    -> RunClaim::ExitCode       `{"exit_code": N}` (0..255), after closing its
                                output; then waits until the daemon hangs up (or
                                kills it)
  a run's report (ForkFds.report): Report, written by the fork's outer process
  (libsandboxd), never by Python.

The user's code shares the run's socket, so the daemon trusts none of it beyond what
the run could choose itself; how the run really ended is the Report (see sandboxd's
pool.rs and isolate/pooled.rs).

In both modes this prologue/epilogue prints nothing of its own, keeps the user's
line numbers in tracebacks and the exit code Python would give (`sys.exit(x)`:
sandboxd_outcome.exit_status) and, when AUTOSAVE is "1", saves every open, non-empty
matplotlib figure exactly once (sandboxd_outcome.Figures): at plt.show(), at exit,
or when sandboxd asks the run to stop (SIGTERM at the timeout).

Exit code 70 (EX_SOFTWARE) means the runner itself failed, not the user's code: the
cause is printed on the run's stderr first, after `sandboxd: the runner failed`.
"""

import builtins
import os
import _signal as signal  # the C module: `signal` imports enum, ~8 ms of startup
import sys

# Beside this file in /opt/sandboxd, which is sys.path[0] (the script's directory),
# imported before the workspace is put on sys.path.
from sandboxd_outcome import WORKSPACE, Figures, exit_status, report_failure

FILENAME = "<code>"
# The runner's own failure (sysexits.h's EX_SOFTWARE); its cause is on stderr.
RUNNER_FAILED = 70
# Bound before the user's code runs, which may replace os._exit (to keep a library
# from exiting, say): the runner's own exits stay the runner's.
_exit = os._exit


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--template":
        template(sys.argv[2])
        return
    try:
        run_id = sys.argv[1] if len(sys.argv) > 1 else "run"
        autosave = len(sys.argv) > 2 and sys.argv[2] == "1"
        code = sys.stdin.buffer.read()
        _stdin_from_devnull()
        namespace = {}
        exit_code = run(code.decode("utf-8", errors="replace"), run_id, autosave, namespace)
        _finish(exit_code, namespace)
    except BaseException:
        _runner_failed()


def _runner_failed():
    """The runner's own code raised (never the user's code: run() catches that):
    say why on stderr, and exit with RUNNER_FAILED."""
    report_failure("sandboxd: the runner failed (exit code %d)" % RUNNER_FAILED)
    _exit(RUNNER_FAILED)


def _stdin_from_devnull():
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def template(preload):
    """A pooled template: import `preload` (comma-separated) once, then fork once
    per run. Each fork enters a sandbox of its own through sandboxd's library
    (`sandboxd_enter`: fresh namespaces, /tmp and /proc, no privileges, seccomp,
    Landlock) before it reads any of the run's code; this process never runs any."""
    import ctypes
    import gc
    import importlib
    import json
    import select
    import socket

    # No collection until the imports are done and frozen (below): one would leave
    # freed holes in pages the forks share, which their first allocations then copy.
    gc.disable()
    sock = socket.socket(fileno=os.dup(0))
    _stdin_from_devnull()
    # Nothing this process prints goes anywhere: each run has its own output.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    failed = []
    for name in filter(None, preload.split(",")):
        try:
            importlib.import_module(name)
        except BaseException:
            failed.append(name)
    try:
        _warm_up()
    except BaseException:
        pass
    # What the imports made stays for good: out of the collector's sight, so that a
    # collection in a fork does not write to (and so copy) every page of it. The
    # forks collect again (_forked); gc.get_objects() there does not list it.
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    sock.sendall(json.dumps({"ready": {"failed": failed}}).encode() + b"\n")
    enter = None
    forks = {}  # pidfd -> pid of the forks still running
    while True:
        ready = select.select([sock, *forks], [], [])[0]
        for fd in ready:
            if fd in forks:
                pid = forks.pop(fd)
                os.close(fd)
                os.waitpid(pid, 0)
                sock.sendall(json.dumps({"reaped": pid}).encode() + b"\n")
        if sock not in ready:
            continue
        data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 5)
        if not data or len(fds) != 5:
            os._exit(0)  # the daemon hung up (or broke the protocol): the pool replaces us
        if enter is None:
            enter = ctypes.CDLL("/proc/self/fd/%d" % fds[0]).sandboxd_enter
            enter.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int)
            enter.restype = ctypes.c_int
        spec = json.dumps(json.loads(data)["spec"]).encode()
        pid = os.fork()
        if pid == 0:
            _forked(enter, spec, sock, fds)
        for fd in fds:
            os.close(fd)
        # The next fork can be made while this one's run is torn down.
        forks[os.pidfd_open(pid)] = pid


def _forked(enter, spec, template_sock, fds):
    """In a fork of the template: become the run's sandbox, then run its code."""
    try:
        import gc
        import json
        import select
        import socket

        gc.enable()  # off in the template, which froze what it holds
        _library, stdout, stderr, run_fd, report_fd = fds
        os.set_inheritable(run_fd, False)  # the run's programs inherit stdio only
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        template_sock.detach()  # closed below, by the library, with every other fd
        # The report channel stays with the fork's outer process: the library closes
        # it in the run's init, before this process exists.
        if enter(spec, len(spec), run_fd, report_fd) != 0:
            os._exit(1)  # the library told the daemon why
        # From here on: the run's own process, in its own sandbox.
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # `random` reseeds itself at fork; numpy's global state does not
        sock = socket.socket(fileno=run_fd)
        sock.sendall(b'{"entered": true}\n')
        _rehearse()
        line = sock.makefile("rb").readline()
        if not line:
            os._exit(0)
        msg = json.loads(line)
        os.chdir(WORKSPACE)  # the workspace is mounted over the directory we started in
        # The run's session, known only now: its variables, and its package layer
        # (mounted since the template started, which found /opt/packages empty).
        # sitecustomize is the one the interpreter imported at its start.
        os.environ.update(msg["env"])
        import sitecustomize

        if msg.get("kernel"):
            _kernel(msg["code"], sock)
        sitecustomize.add_packages_layer()
        namespace = {}
        exit_code = run(msg["code"], msg["run_id"], bool(msg["autosave"]), namespace)
        # RunClaim::ExitCode, made before the user's code could break `json`.
        claim = b'{"exit_code": %d}\n' % exit_code

        def report():
            os.close(1)
            os.close(2)
            try:
                sock.sendall(claim)
                # The daemon answers, then kills this sandbox: its teardown (unmapping a
                # copy of the template's memory) waits until then, behind the answer.
                # If it hangs up instead (it did not take the claim), exit: the outer
                # process reports how.
                while not select.select([sock], [], [])[0]:
                    pass
            except OSError:
                pass

        _finish(exit_code, namespace, report)
    except BaseException:
        _runner_failed()


def _rehearse():
    """In a fork, ahead of its run's code: go once through a run's own steps on
    empty code, writing nothing. A fork shares its template's memory until it
    writes to it, and maps the interpreter's code as it runs it: each first touch is
    a page fault (~350 for a `print(1)`, ~3 ms on the project's VM). Taken here,
    they are not in the run's time; a run touches these pages anyway. Nothing of it
    stays: no output, no figure, no handler, sys.path as it was."""
    path = list(sys.path)
    try:
        import json

        msg = json.loads('{"code": "", "run_id": "rehearsal", "autosave": false, "env": {}}')
        run(msg["code"], msg["run_id"], bool(msg["autosave"]), {})
        for stream in (sys.stdout, sys.stderr):
            stream.write("")
            stream.flush()
    except BaseException:
        pass
    finally:
        sys.path[:] = path


def _kernel(source, sock):
    """Become a kernel session's kernel: `source` is kernel.py (sent by the daemon,
    which embeds it), run as __main__ with the run's socket as its channel on fd 0,
    where a kernel started cold finds it too. It serves cells until the daemon
    hangs up; this process then exits, and its outer process reports how."""
    os.dup2(sock.fileno(), 0)
    sock.close()
    # As a cold kernel's `python -P`: not this runner's directory on sys.path, where
    # its modules would hide packages of the same names the session installs.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    exec(compile(source, "kernel.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    _exit(0)


def _finish(exit_code, namespace, before_exit=None):
    """End the process as the interpreter would, without its teardown of every
    module (~2 ms of a cold `print(1)`, far more with pandas loaded): wait for the
    user's non-daemon threads, run the atexit handlers, release the user's globals
    (so a file left open is flushed and closed by its finaliser), flush the standard
    streams, then leave with the user's exit code. As the interpreter does, an
    exception on the way (a signal handler of the user's raising while its threads
    are waited for) is printed and the exit goes on."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            report_failure("Exception ignored on threading shutdown")
    try:
        import atexit

        atexit._run_exitfuncs()  # prints what a handler raises itself
    except BaseException:
        report_failure("Exception ignored in atexit callbacks")
    try:
        for name in reversed(list(namespace)):
            if name != "__builtins__":  # finalisers may still need it
                del namespace[name]
    except BaseException:
        report_failure("Exception ignored while releasing the run's globals")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if before_exit is not None:
        before_exit()
    _exit(exit_code)


def _warm_up():
    """Do once, on constant data, what a first plotting cell pays for on top of the
    imports: loading the Agg renderer, the fonts and the PNG writer, and pandas'
    plotting glue. It leaves no figure open (the user's first is still Figure 1)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import io

    pd = sys.modules.get("pandas")
    try:
        if pd is not None:
            ax = pd.DataFrame({"x": [0, 1], "y": [0.0, 1.0]}).plot(x="x", y="y", title="t")
        else:
            ax = plt.figure().add_subplot()
            ax.plot([0, 1], [0.0, 1.0])
            ax.set_title("t")
        ax.figure.savefig(io.BytesIO(), format="png")
    finally:
        plt.close("all")


def run(source, run_id, autosave, globals_):
    """Run the user's code as __main__ in `globals_` (empty); return its exit code."""
    figures = Figures() if autosave else None
    if figures is not None:
        figures.begin(run_id)

        def on_term(signum, frame):
            figures.save_open(close=False)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            # Die of the signal itself, so the run reports how it really ended.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, on_term)

    sys.argv = [FILENAME]
    globals_.update({"__name__": "__main__", "__builtins__": builtins, "__file__": FILENAME})
    sys.path.insert(0, WORKSPACE)
    exit_code = 0
    try:
        compiled = compile(source, FILENAME, "exec", dont_inherit=True)
        exec(compiled, globals_)
    except SystemExit as e:
        exit_code = exit_status(e.code)
    except BaseException as e:  # the user's error: print it as Python would
        exit_code = 1
        try:
            # Imported only now: most runs never need them, and they cost startup time.
            import linecache
            import traceback

            linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
            tb = e.__traceback__
            if not isinstance(e, SyntaxError) and tb is not None:
                tb = tb.tb_next  # drop this runner's frame
            traceback.print_exception(type(e), e, tb)
        except BaseException:
            # No traceback module (the user's code used up its file descriptors,
            # say): the error's own line at least.
            report_failure("sandboxd: the run's %s could not be printed in full" % type(e).__name__)
    if figures is not None:
        figures.save_open(close=False)
    return exit_code

