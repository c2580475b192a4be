"""A kernel: one interpreter that keeps its state across the cells of a session.

Run by sandboxd inside a session's sandbox as `python - SOCKET`, this file on stdin. The
daemon embeds this file in its binary, so the rootfs need not be rebuilt when it
changes. It connects to the daemon's socket (bound read-only at /run inside the
sandbox) and serves one cell at a time: a JSON line in, a JSON line out. During a
cell, fds 1 and 2 are pipes the kernel drains itself (capped), so output from C
code and subprocesses is captured too; when the cell asks for `stream`, what is kept
is also sent as it arrives, as `{"stream": "stdout"|"stderr", "run_id", "text"}`
lines ahead of the reply. SIGINT (the daemon's timeout) interrupts the
cell with KeyboardInterrupt and the state stays.
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
        line = json.dumps(obj).encode() + b"\n"
        with self.lock:
            self.conn.sendall(line)


class Capture:
    """Point fd `fd` at a pipe for the cell and keep the first `limit` bytes; with a
    `channel`, send what is kept as it arrives, under the stream's `name`."""

    def __init__(self, fd, limit, name=None, channel=None, run_id=None):
        self.fd, self.limit = fd, limit
        self.name, self.channel, self.run_id = name, channel, run_id
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.data, self.truncated = bytearray(), False
        self.saved = os.dup(fd)
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.reader = threading.Thread(target=self._drain, args=(r,), daemon=True)
        self.reader.start()

    def _drain(self, r):
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                room = self.limit - len(self.data)
                if room > 0:
                    self.data += chunk[:room]
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
                channel.send({"stream": self.name, "run_id": self.run_id, "text": text})
            except OSError:
                self.channel = None  # the daemon is gone; the cell's reply will fail too

    def finish(self):
        os.dup2(self.saved, self.fd)
        os.close(self.saved)
        # Whatever still holds the pipe (a background process) is not waited for.
        self.reader.join(0.5)
        self._stream(b"", final=True)
        self.channel = None
        return self.data.decode("utf-8", errors="replace"), self.truncated


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


def _clip(text, limit=64 * 1024):
    return text if len(text) <= limit else text[:limit] + "…"


def run_cell(namespace, msg, channel):
    code = msg["code"]
    limit = int(msg.get("output_limit", 100 * 1024))
    streaming = channel if msg.get("stream") else None
    run_id = msg.get("run_id", "cell")
    out, err = Capture(1, limit, "stdout", streaming, run_id), Capture(2, limit, "stderr", streaming, run_id)
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
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        import traceback

        tb = e.__traceback__.tb_next if e.__traceback__ is not None and not isinstance(e, SyntaxError) else e.__traceback__
        text = "".join(traceback.format_exception(type(e), e, tb))
        sys.stderr.write(text)
        exception = {"name": type(e).__name__, "value": str(e), "traceback": text}
        exit_code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        if msg.get("autosave", True):
            save_figures(run_id)
    stdout, stdout_truncated = out.finish()
    stderr, stderr_truncated = err.finish()
    return {
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_truncated,
        "stderr_truncated": stderr_truncated,
        "result": result,
        "exception": exception,
        "exit_code": exit_code,
    }


def main():
    path = sys.argv[1]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.path.insert(0, WORKSPACE)
    sys.argv = [FILENAME]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    reader = conn.makefile("rb")
    channel = Channel(conn)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    while True:
        line = reader.readline()
        if not line:
            return
        channel.send(run_cell(namespace, json.loads(line), channel))


if __name__ == "__main__":
    main()
