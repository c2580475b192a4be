"""A kernel: one interpreter that keeps its state across the cells of a session.

Run by sandboxd inside a session's sandbox as `python -P -c BOOTSTRAP`, with a socket
to the daemon as stdin. The messages are the typed ones of
sandboxd/src/isolate/message.rs (names below are its types; their bytes must stay
what its round-trip tests pin):

  <- kernel_source          kernel.py's length in 10 decimal digits, then kernel.py:
                            the bootstrap reads exactly that and runs it (the daemon
                            embeds this file in its binary)
  -> KernelMessage::Ready   `{"kind": "ready"}`: cells are served from now on
  <- KernelCell             one JSON line: `code`, `run_id`, `autosave`,
                            `output_limit`, `nonce`, `env` (an object of
                            NAME -> VALUE, set in os.environ before the cell: the
                            session's secrets' placeholders, which may change
                            between cells)
  -> KernelMessage::Chunk   `{"kind": "chunk", "nonce", "stream": "stdout"|"stderr",
                            "text"}`: the cell's output, as it arrives
  -> KernelMessage::Reply   `{"kind": "reply", "nonce", "result": Rich|null,
                            "exception": Exception|null, "exit_code": 0..255,
                            "stdout_truncated", "stderr_truncated"}`: the cell is
                            over. Rich is `{"text/plain", "text/html"?}` (a final
                            expression's value), Exception `{"name", "value",
                            "traceback"}`.

Everything is sent with json.dumps(ensure_ascii=False), one object per line. The
kernel moves the socket off fd 0 (the user's code gets /dev/null as stdin). During a
cell, fds 1 and 2 are pipes the kernel drains itself (capped at `output_limit`), so
output from C code and subprocesses is captured too. Every line carries the cell's
nonce, so the daemon drops whatever an earlier cell's leftovers send. The daemon
trusts none of it (the user's code shares this process): it bounds, checks and caps
it all itself. SIGINT (the daemon's timeout) interrupts the cell with
KeyboardInterrupt and the state stays.

Before each cell the kernel also looks for packages installed since the last one:
the session's package layer (/opt/packages/current, made by its first install and
swapped whole by each later one) goes on sys.path once it exists, and the import
system forgets what it cached of directories, so a package installed while the
kernel runs imports in the next cell, without a restart.

A cell ends as a run does (sandboxd_outcome, shared with the runner): `sys.exit(x)`
gives the exit code Python would and the kernel lives on; with `autosave`, the open
figures are saved as `figure-<run8>-<n>.png` and closed. When the kernel's own
machinery fails (not the user's code), the cause goes to the cell's stderr as a
chunk and the kernel exits with 70 (EX_SOFTWARE); the daemon restarts it.
"""

import ast
import builtins
import codecs
import importlib
import json
import os
import socket
import sys
import threading
import traceback  # here, not when a failure needs it: no file may be left to open then

FILENAME = "<cell>"
# The support code shared with the runner, in the rootfs; loaded by its full path:
# with -P neither /opt/sandboxd nor the working directory (the workspace) is on
# sys.path, so nothing in the workspace can stand in for it.
SUPPORT = "/opt/sandboxd/sandboxd_outcome.py"
# The kernel's own failure (sysexits.h's EX_SOFTWARE); its cause is on stderr.
KERNEL_FAILED = 70
_exit = os._exit  # the user's code may replace os._exit; the kernel's own exit stays


def _load_support():
    import importlib.util

    if not os.path.isfile(SUPPORT):
        raise SystemExit("sandboxd: %s is missing: the rootfs is older than this daemon; rebuild it (rootfs/build.sh)" % SUPPORT)
    spec = importlib.util.spec_from_file_location("sandboxd_outcome", SUPPORT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _packages_layer():
    """sitecustomize.add_packages_layer, from the sitecustomize the interpreter
    imported at its start: the rootfs's or, in a rootfs older than this daemon,
    Debian's, which has none."""
    add = getattr(sys.modules.get("sitecustomize"), "add_packages_layer", None)
    if add is None:
        raise SystemExit("sandboxd: the rootfs's sitecustomize has no add_packages_layer: the rootfs is older than this daemon; rebuild it (rootfs/build.sh)")
    return add


outcome = _load_support()
add_packages_layer = _packages_layer()
WORKSPACE = outcome.WORKSPACE
FIGURES = outcome.Figures()


class Channel:
    """The connection to the daemon, shared by the main thread and the drains."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, obj):
        # Raw UTF-8 (half the size of \u escapes); a lone surrogate becomes "?".
        line = json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace") + b"\n"
        with self.lock:
            self.conn.sendall(line)


class Capture:
    """Point fd `fd` at a pipe for the cell and send the first `limit` bytes on
    `channel` as they arrive, under the stream's `name`."""

    def __init__(self, fd, limit, name, channel, nonce):
        self.fd, self.limit = fd, limit
        self.name, self.channel, self.nonce = name, channel, nonce
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.kept, self.truncated = 0, False
        self.saved = os.dup(fd)
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.reader = threading.Thread(target=self._drain, args=(r,), daemon=True)
        self.reader.start()

    def _drain(self, r):
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                room = self.limit - self.kept
                if room > 0:
                    self.kept += len(chunk[:room])
                    self._stream(chunk[:room])
                if len(chunk) > max(room, 0):
                    self.truncated = True

    def _stream(self, data, final=False):
        channel = self.channel
        if channel is None:
            return
        text = self.decoder.decode(data, final)
        if text:
            try:
                # Tagged with the cell: what a background process writes after the
                # reply is not taken for the next cell's output.
                channel.send({"kind": "chunk", "nonce": self.nonce, "stream": self.name, "text": text})
            except OSError:
                self.channel = None  # the daemon is gone; the cell's reply will fail too

    def finish(self):
        os.dup2(self.saved, self.fd)
        os.close(self.saved)
        # Whatever still holds the pipe (a background process) is not waited for.
        self.reader.join(0.5)
        self._stream(b"", final=True)
        self.channel = None
        return self.truncated


def rich(value):
    out = {"text/plain": _clip(repr(value))}
    html = getattr(value, "_repr_html_", None)
    if callable(html):
        try:
            h = html()
            if isinstance(h, str):
                out["text/html"] = _clip(h)
        except Exception:
            pass
    return out


def _clip(text, limit=16 * 1024):
    return text if len(text) <= limit else text[:limit] + "…"


def run_cell(namespace, msg, channel):
    code = msg["code"]
    os.environ.update(msg["env"])
    # Packages installed since the last cell. Once the layer is on sys.path, what
    # finds them is forgetting the directory listings the import system cached
    # (adding the layer forgets them too).
    if not add_packages_layer():
        importlib.invalidate_caches()
    limit = int(msg["output_limit"])
    run_id, nonce = msg["run_id"], msg["nonce"]
    out, err = Capture(1, limit, "stdout", channel, nonce), Capture(2, limit, "stderr", channel, nonce)
    if msg["autosave"]:
        FIGURES.begin(run_id)
    else:
        FIGURES.end()
    result = exception = None
    exit_code = 0
    try:
        tree = ast.parse(code, FILENAME, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        import linecache

        linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
        exec(compile(tree, FILENAME, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, FILENAME, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                result = rich(value)
    except SystemExit as e:
        exit_code = outcome.exit_status(e.code)
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ is not None and not isinstance(e, SyntaxError) else e.__traceback__
        text = "".join(traceback.format_exception(type(e), e, tb))
        sys.stderr.write(text)
        try:
            value = str(e)
        except BaseException:
            value = "<unprintable %s>" % type(e).__name__
        exception = {"name": _clip(type(e).__name__, 200), "value": _clip(value), "traceback": _clip(text)}
        exit_code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        FIGURES.save_open(close=True)  # nothing when not autosaving
        FIGURES.end()
    stdout_truncated = out.finish()
    stderr_truncated = err.finish()
    return {
        "kind": "reply",
        "nonce": nonce,
        "stdout_truncated": stdout_truncated,
        "stderr_truncated": stderr_truncated,
        "result": result,
        "exception": exception,
        "exit_code": exit_code,
    }


def main():
    # The daemon's socket moves off fd 0 (not inherited by subprocesses); the user's
    # code gets /dev/null as stdin.
    conn = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.path.insert(0, WORKSPACE)
    sys.argv = [FILENAME]
    reader = conn.makefile("rb")
    channel = Channel(conn)
    channel.send({"kind": "ready"})
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    while True:
        line = reader.readline()
        if not line:
            return
        nonce = None
        # Looked up before the cell runs: what the cell does to the channel applies
        # from the next cell's reply on.
        send = channel.send
        try:
            msg = json.loads(line)
            nonce = msg["nonce"]
            reply = run_cell(namespace, msg, channel)
        except BaseException:
            failed(channel, nonce)
        send(reply)


def failed(channel, nonce):
    """The kernel's own code raised (the user's code ran out of file descriptors,
    say): send the cause as the cell's stderr, then exit with KERNEL_FAILED."""
    exc = sys.exc_info()[1]
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        text = "%s\n" % type(exc).__name__
    text = "sandboxd: the kernel failed (exit code %d):\n%s" % (KERNEL_FAILED, text)
    try:
        if nonce is None:
            raise ValueError("no cell to report to")
        channel.send({"kind": "chunk", "nonce": nonce, "stream": "stderr", "text": _clip(text)})
    except BaseException:
        outcome.report_failure("sandboxd: the kernel failed (exit code %d)" % KERNEL_FAILED)
    _exit(KERNEL_FAILED)


if __name__ == "__main__":
    main()
