"""Imported by every Python process in the sandbox (installed as the venv's
sitecustomize). When, and only when, matplotlib is first imported, give it a
writable config directory whose font list is the one built at image time, so no
run rebuilds the font cache or warns about a cache directory."""

import sys


class _MatplotlibConfig:
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "matplotlib":
            sys.meta_path.remove(self)
            _prepare()
        return None


def _prepare():
    import os

    target = os.environ.get("MPLCONFIGDIR")
    source = "/opt/sandboxd/mplconfig"
    if not target or os.path.isdir(target):
        return
    try:
        os.mkdir(target, 0o700)
        for name in os.listdir(source):
            os.symlink(os.path.join(source, name), os.path.join(target, name))
    except OSError:
        pass


sys.meta_path.insert(0, _MatplotlibConfig())
