"""Imported by every Python process in the sandbox (installed as the venv's
sitecustomize). When, and only when, matplotlib is first imported, give it a
writable config directory whose font list is the one built at image time, so no
run rebuilds the font cache or warns about a cache directory. And put the
session's package layer on sys.path (add_packages_layer), after the rootfs's own
packages, which stay first."""

import sys

# The session's package layer (pip's --prefix layout), mounted at /opt/packages when
# its policy allows packages; `current` is swapped whole by each install.
PACKAGES_SITE = "/opt/packages/current/lib/python3.11/site-packages"


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


def add_packages_layer():
    """Put the session's package layer on sys.path (its .pth files read, as a site
    directory's are), and forget what the import system cached of directories, so
    what was installed since is found. The layer's site directory is made if the
    layer (a writable /opt/packages) has none yet: a `pip install` in this very
    process then lands where it already looks. True if it was added now. Called at
    every interpreter's start, by a pooled run once its session's layer is
    attached, and by a kernel before each cell (a layer made or filled since)."""
    import os

    if PACKAGES_SITE in sys.path:
        return False
    if not os.path.isdir(PACKAGES_SITE):
        if not os.access("/opt/packages", os.W_OK):
            return False  # no layer: the session's policy installs no packages
        try:
            os.makedirs(PACKAGES_SITE, exist_ok=True)
        except OSError:
            return False
    import importlib
    import site

    site.addsitedir(PACKAGES_SITE)
    importlib.invalidate_caches()
    return True


sys.meta_path.insert(0, _MatplotlibConfig())
add_packages_layer()
