"""What a run of user code ends with, the same in every mode: its exit status and
its matplotlib figures. Shared by the runner (`sandboxd_runner.py`: script and
pooled runs) and the kernel (`kernel.py`: a session's cells).

- `exit_status(code)`: the exit status Python itself gives `sys.exit(code)`.
- `Figures`: saves each open, non-empty figure once, into the workspace as
  `figure-<first 8 characters of the run id>-<n>.png` (n = 1, 2, ... per run or
  cell); sandboxd lists files named so as the run's `figure` artifacts (run.rs).
  `plt.show()` saves (and closes) the open figures instead of blocking; a figure
  the user saved with `savefig` is not saved again.
- `report_failure(heading)`: tell the run's stderr why the support code itself
  failed, without ever raising.

Where it is loaded from: /opt/sandboxd, by the runner (its own directory is first on
sys.path) and by the kernel (by this file's full path: it runs with `python -P`).
Both load it before the workspace is put on sys.path, so a file of the same name in
the workspace never replaces it. It imports only `os` and `sys`: a cold run pays for
nothing else unless it plots.
"""

import os
import sys

WORKSPACE = "/mnt/data"
# CPython converts an int exit code with PyLong_AsLong: one out of a C long's range
# becomes -1, i.e. status 255.
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def exit_status(code):
    """The process exit status of `sys.exit(code)` as CPython 3.11 ends a process:
    None → 0; an int (bool included) → its low 8 bits (255 past a C long); anything
    else is printed on stderr (as `str`) and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        value = int.__index__(code)  # the int's own value, whatever a subclass overrides
        return value & 0xFF if _LONG_MIN <= value <= _LONG_MAX else 255
    try:
        text = str(code)
    except Exception:
        return 1  # as CPython: an unprintable code prints nothing
    stream = sys.stderr
    try:
        if stream is None:
            raise OSError("no sys.stderr")
        stream.write(text + "\n")
        stream.flush()
    except Exception:
        _write_fd2(text + "\n")
    return 1


def report_failure(heading):
    """Print the exception being handled on stderr, after `<heading>:`. Never
    raises: it reports the support code's own failures (fds may be exhausted, the
    user's code may have broken sys.stderr or the traceback module)."""
    exc = sys.exc_info()[1]
    try:
        import traceback

        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        try:
            text = "%s: %s\n" % (type(exc).__name__, exc)
        except BaseException:
            text = "%s\n" % type(exc).__name__
    for stream in (sys.__stderr__, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _write_fd2("%s:\n%s" % (heading, text))


def _write_fd2(text):
    data = text.encode("utf-8", "backslashreplace")
    try:
        while data:
            data = data[os.write(2, data) :]
    except BaseException:
        pass


def _has_content(fig):
    return bool(fig.get_axes() or fig.images or fig.texts or fig.lines or fig.patches)


class Figures:
    """Saves open figures once each, named uniquely for the run (or cell) begun with
    `begin(run_id)`. Between `end()` and the next `begin()` nothing is saved and
    `plt.show()` is matplotlib's own."""

    def __init__(self):
        self.prefix = None  # None: not saving
        self.count = 0
        self.saving = False  # True while we save: our savefig is not the user's
        self.hooked = False

    def begin(self, run_id):
        self.prefix = "figure-%s-" % run_id[:8]
        self.count = 0
        if not self.hooked:
            self.hooked = True
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:  # imported already (preloaded, or an earlier cell)
                self._patch(pyplot)
            else:
                sys.meta_path.insert(0, _PyplotHook(self))

    def end(self):
        self.prefix = None

    def save_open(self, close):
        """Save every open, non-empty figure not saved yet (closing each, with
        `close`). A failure is printed on stderr, never raised: the user's result
        stands whatever the figures do."""
        if self.prefix is None:
            return
        try:
            plt = sys.modules.get("matplotlib.pyplot")
            if plt is None:
                return
            for num in list(plt.get_fignums()):
                fig = plt.figure(num)
                if not getattr(fig, "_sandboxd_saved", False) and _has_content(fig):
                    try:
                        self._save(fig)
                    except Exception:  # one broken figure: the others are still saved
                        report_failure("sandboxd: figure %d could not be saved" % num)
                if close:
                    plt.close(fig)
        except BaseException:  # a KeyboardInterrupt (a kernel's timeout) too
            report_failure("sandboxd: saving the open figures failed")

    def _save(self, fig):
        self.count += 1
        path = os.path.join(WORKSPACE, "%s%d.png" % (self.prefix, self.count))
        self.saving = True
        try:
            fig.savefig(path)
        finally:
            self.saving = False
        fig._sandboxd_saved = True

    def _patch(self, pyplot):
        """Make plt.show() save instead of block, and remember explicit savefig calls."""
        figures = self
        figure_cls = sys.modules["matplotlib.figure"].Figure
        original_savefig = figure_cls.savefig
        original_show = pyplot.show

        def savefig(fig, *args, **kwargs):
            result = original_savefig(fig, *args, **kwargs)
            if not figures.saving:
                fig._sandboxd_saved = True
            return result

        def show(*args, **kwargs):
            if figures.prefix is None:
                return original_show(*args, **kwargs)
            figures.save_open(close=True)

        figure_cls.savefig = savefig
        pyplot.show = show


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
            figures._patch(module)

        loader.exec_module = exec_module
        return spec
