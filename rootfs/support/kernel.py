"""A kernel: one interpreter that keeps its state across the cells of a session.

Run by sandboxd inside a session's sandbox as `python -c BOOTSTRAP`, with a socket to
the daemon as stdin: the bootstrap reads this file from the socket (length-prefixed;
the daemon embeds it in its binary, so the rootfs need not be rebuilt when it
changes) and runs it. The kernel moves the socket off fd 0 (the user's code gets
/dev/null as stdin), says `{"kind": "ready"}` and serves one cell at a time: a JSON
line in (`code`, `run_id`, `nonce`, `autosave`, `output_limit`), JSON lines out.
During a cell, fds 1 and 2 are pipes the kernel drains itself (capped), so output
from C code and subprocesses is captured too; what is kept is sent as it arrives,
as `{"kind": "chunk", "nonce", "stream": "stdout"|"stderr", "text"}` lines, and the
cell ends with `{"kind": "reply", "nonce", "result", "exception", "exit_code",
"stdout_truncated", "stderr_truncated"}`. Every line carries the cell's nonce, so
the daemon drops whatever an earlier cell's leftovers send. The daemon trusts none
of it (the user's code shares this process): it bounds, checks and caps it all
itself. SIGINT (the daemon's timeout) interrupts the cell with KeyboardInterrupt
and the state stays.
"""

import ast
import builtins
import codecs
import json
import os
import socket
import sys
import threading

FILENAME = "<cell>"
WORKSPACE = "/mnt/data"


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


def save_figures(run_id):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    n = 0
    for num in list(plt.get_fignums()):
        fig = plt.figure(num)
        if fig.get_axes() or fig.images or fig.texts or fig.lines or fig.patches:
            n += 1
            try:
                fig.savefig(os.path.join(WORKSPACE, "figure-%s-%d.png" % (run_id[:8], n)))
            except Exception:
                import traceback

                traceback.print_exc()
        plt.close(fig)


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
    limit = int(msg["output_limit"])
    run_id, nonce = msg["run_id"], msg["nonce"]
    out, err = Capture(1, limit, "stdout", channel, nonce), Capture(2, limit, "stderr", channel, nonce)
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
        # As a process's exit status would be.
        exit_code = (e.code & 0xFF) if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        import traceback

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
        if msg["autosave"]:
            save_figures(run_id)
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
        channel.send(run_cell(namespace, json.loads(line), channel))


if __name__ == "__main__":
    main()
