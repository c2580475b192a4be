"""Runs one cell of user code inside a sandbox (script mode).

Started by sandboxd as `/opt/py/bin/python /opt/sandboxd/runner.py RUN_ID AUTOSAVE`
(runner.py only imports this module and calls main()).
The code arrives on stdin; stdin is then pointed at /dev/null so the user's code
sees an empty stdin.

In a pooled sandbox it is started ahead of its runs as `runner.py --template
MODULES`, with a socket to the daemon as stdin: it imports MODULES (comma-separated),
says `{"ready": {"failed": [...]}}`, and then forks once per run (see template());
the fork says `{"entered": true}`, waits for `{"code", "run_id", "autosave"}` (the
workspace is mounted by then), runs the code once, and claims `{"exit_code": N}`
after closing its output, then waits until the daemon hangs up (or kills it). The
user's code shares that socket, so the daemon trusts none of it beyond what the
run could choose itself; how the run really ended is reported by the fork's outer
process on a channel of its own (see sandboxd's pool.rs and
isolate/template.rs). This prologue/epilogue prints nothing of its own, keeps the
user's line numbers in tracebacks and the user's exit code, and, when AUTOSAVE is
"1", saves every open, non-empty matplotlib figure exactly once: at plt.show(), at
exit, or when sandboxd asks the run to stop (SIGTERM at the timeout).
"""

import builtins
import os
import _signal as signal  # the C module: `signal` imports enum, ~8 ms of startup
import sys

FILENAME = "<code>"
WORKSPACE = "/mnt/data"


class _Figures:
    """Saves open figures once each, named uniquely for this run."""

    def __init__(self, run_id):
        self.prefix = "figure-%s-" % run_id[:8]
        self.count = 0
        self.saving = False

    def _save(self, fig):
        self.count += 1
        path = os.path.join(WORKSPACE, "%s%d.png" % (self.prefix, self.count))
        self.saving = True
        try:
            fig.savefig(path)
        finally:
            self.saving = False
        fig._sandboxd_saved = True

    def save_open(self, close):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in list(plt.get_fignums()):
            fig = plt.figure(num)
            if not getattr(fig, "_sandboxd_saved", False) and _has_content(fig):
                try:
                    self._save(fig)
                except Exception:  # a broken figure must not hide the user's result
                    import traceback

                    traceback.print_exc()
            if close:
                plt.close(fig)

    def patch(self, pyplot):
        """Make plt.show() save instead of block, and remember explicit savefig calls."""
        figures = self
        figure_cls = sys.modules["matplotlib.figure"].Figure
        original_savefig = figure_cls.savefig

        def savefig(fig, *args, **kwargs):
            result = original_savefig(fig, *args, **kwargs)
            if not figures.saving:
                fig._sandboxd_saved = True
            return result

        def show(*args, **kwargs):
            figures.save_open(close=True)

        figure_cls.savefig = savefig
        pyplot.show = show


def _has_content(fig):
    return bool(fig.get_axes() or fig.images or fig.texts or fig.lines or fig.patches)


class _PyplotHook:
    """Patches matplotlib.pyplot right after the user's code imports it."""

    def __init__(self, figures):
        self.figures = figures

    def find_spec(self, fullname, path, target=None):
        if fullname != "matplotlib.pyplot":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module
        figures = self.figures

        def exec_module(module):
            original_exec(module)
            figures.patch(module)

        loader.exec_module = exec_module
        return spec


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--template":
        template(sys.argv[2])
        return
    run_id = sys.argv[1] if len(sys.argv) > 1 else "run"
    autosave = len(sys.argv) > 2 and sys.argv[2] == "1"
    code = sys.stdin.buffer.read()
    _stdin_from_devnull()
    namespace = {}
    exit_code = run(code.decode("utf-8", errors="replace"), run_id, autosave, namespace)
    _finish(exit_code, namespace)


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
    import importlib
    import json
    import select
    import socket

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
        import json
        import select
        import socket

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
        line = sock.makefile("rb").readline()
        if not line:
            os._exit(0)
        msg = json.loads(line)
        os.chdir(WORKSPACE)  # the workspace is mounted over the directory we started in
        namespace = {}
        exit_code = run(msg["code"], msg["run_id"], bool(msg["autosave"]), namespace)

        def report():
            os.close(1)
            os.close(2)
            try:
                sock.sendall(json.dumps({"exit_code": exit_code}).encode() + b"\n")
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
        os._exit(70)


def _finish(exit_code, namespace, before_exit=None):
    """End the process as the interpreter would, without its teardown of every
    module (~2 ms of a cold `print(1)`, far more with pandas loaded): wait for the
    user's non-daemon threads, run the atexit handlers, release the user's globals
    (so a file left open is flushed and closed by its finaliser), flush the standard
    streams, then leave with the user's exit code."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
        for name in reversed(list(namespace)):
            if name != "__builtins__":  # finalisers may still need it
                del namespace[name]
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if before_exit is not None:
            before_exit()
        os._exit(exit_code)


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
    figures = _Figures(run_id) if autosave else None
    if figures is not None:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:  # preloaded
            figures.patch(pyplot)
        else:
            sys.meta_path.insert(0, _PyplotHook(figures))

        def on_term(signum, frame):
            figures.save_open(close=False)
            sys.stdout.flush()
            sys.stderr.flush()
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
        exit_code = _exit_code(e.code)
    except BaseException as e:  # the user's error: print it as Python would
        # Imported only now: most runs never need them, and they cost startup time.
        import linecache
        import traceback

        linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
        tb = e.__traceback__
        if not isinstance(e, SyntaxError) and tb is not None:
            tb = tb.tb_next  # drop this runner's frame
        traceback.print_exception(type(e), e, tb)
        exit_code = 1
    if figures is not None:
        figures.save_open(close=False)
    return exit_code


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1

