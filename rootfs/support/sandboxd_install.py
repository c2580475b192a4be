"""sandboxd's package installer: installs packages into the session's package layer.

Run by sandboxd as `/opt/py/bin/python /opt/sandboxd/sandboxd_install.py` in a
sandbox of the session (as the sandbox user, its network through the egress proxy,
the layer mounted read-write at /opt/packages, no workspace), with one JSON object
on stdin:

    {"packages": ["requests==2.32.3", "tabulate"], "index_url": "https://pypi.org/simple",
     "only_binary": true}

The requirements are already checked by the daemon (names, extras and version
specifiers only). The layer's live tree is /opt/packages/current, in pip's --prefix
layout (lib/python3.11/site-packages, bin), which every Python of the session puts
on sys.path after the rootfs's own packages (sitecustomize.add_packages_layer).

1. Resolve with `uv pip compile` against the index, constrained to the rootfs's
   packages (/opt/sandboxd/constraints.txt: they cannot be replaced) and to the
   layer's for packages the request does not name (earlier installs stay
   consistent); a package the request names keeps its version in the layer if
   that still satisfies the request (as pip's "already satisfied"). Wheels only
   unless `only_binary` is false.
2. Install only what neither the rootfs nor the layer holds at that version (uv's
   --prefix and --target would install everything again), `--no-deps`, into a
   stage: a hard-linked copy of `current`, so a package already in the layer at
   another version is replaced in the stage and nowhere else.
3. Swap the stage and `current` in one step (renameat2 RENAME_EXCHANGE), then
   remove the old tree. A failed or killed install leaves `current` as it was;
   what it left (.stage, .tmp) is removed by the next install.

uv's cache and temporary files are on the layer's filesystem (.tmp), not /tmp (a
small tmpfs), and are removed afterwards. uv's messages go to stderr as they are.
Exit codes: 0, and the last line on stdout is
`{"installed": [{"name", "version"}], "unchanged": [names already satisfied]}`;
1, the install failed and the layer is as it was (stderr says why: uv's words,
then a line of ours); 70 (EX_SOFTWARE), the installer itself failed (a traceback
on stderr).
"""

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import traceback

from packaging.version import InvalidVersion, Version

LAYER = "/opt/packages"
CURRENT = LAYER + "/current"
STAGE = LAYER + "/.stage"
TMP = LAYER + "/.tmp"
SITE = "lib/python3.11/site-packages"
ROOTFS_SITE = "/opt/py/" + SITE
ROOTFS_PINS = "/opt/sandboxd/constraints.txt"
PYTHON = "/opt/py/bin/python"
UV = "/opt/py/bin/uv"
INSTALLER_FAILED = 70
FULL = "the session's package layer is full"
AS_IT_WAS = "nothing was installed, the session's packages are as they were"


class Failed(Exception):
    """The install failed; the message says why, after what uv printed."""


def canonicalize_name(name):
    """A project's name as the index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def name_of(requirement):
    """The project a requirement names (the daemon checked its form: a name,
    extras, version specifiers)."""
    return canonicalize_name(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def installed(site):
    """What a site directory holds, from its `NAME-VERSION.dist-info` directories
    (the names every installer writes; reading each one's METADATA would cost
    more than the rest of this script): canonical name -> Version. A project
    with two of them (pip leaves the old one behind when it replaces a package
    of the layer: it uninstalls nothing outside its environment, /opt/py), or
    with no valid version, counts as absent: an install that needs it puts it
    back whole."""
    found, absent = {}, set()
    try:
        entries = os.listdir(site)
    except FileNotFoundError:
        return found
    for entry in entries:
        if not entry.endswith(".dist-info"):
            continue
        name, _, version = entry[: -len(".dist-info")].partition("-")
        name = canonicalize_name(name)
        if name in found:
            absent.add(name)
        try:
            found[name] = Version(version)
        except InvalidVersion:
            absent.add(name)
    return {name: version for name, version in found.items() if name not in absent}


def clear(path):
    """Remove what an earlier install left at `path`, if anything."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def is_full(err):
    """Whether `err` says the layer's filesystem has no room left."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def run(what, argv, env=None):
    """Run a program for the step `what`; its messages go to our stderr as they
    are. Failed if it fails."""
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        if "No space left on device" in p.stderr or "Disk quota exceeded" in p.stderr:
            raise Failed(FULL)
        raise Failed("%s failed (exit code %d)" % (what, p.returncode))


def exchange(a, b):
    """Swap the trees at `a` and `b` in one step (renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), b)


def write_lines(path, lines):
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines)


def read_pins(path):
    """uv's resolution (`name==version` lines): canonical name -> Version."""
    pins = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[canonicalize_name(name)] = Version(version.split(";", 1)[0].strip())
    return pins


def image_conflicts(packages, rootfs):
    """The requirements that no version the rootfs holds can meet: why a
    resolution failed, in words the user can act on (uv names only the pin)."""
    from packaging.requirements import Requirement  # only when a resolution failed

    conflicts = []
    for requirement in map(Requirement, packages):
        held = rootfs.get(canonicalize_name(requirement.name))
        if held is not None and not requirement.specifier.contains(held, prereleases=True):
            conflicts.append("%s is part of the sandbox's image at %s, which cannot be replaced" % (requirement.name, held))
    return conflicts


def install(packages, index, only_binary):
    for leftover in (STAGE, TMP):
        clear(leftover)
    os.makedirs(TMP + "/tmp")
    # uv's behaviour is set here and by nothing the sandbox's environment holds.
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env.update(
        UV_CACHE_DIR=TMP + "/cache",
        TMPDIR=TMP + "/tmp",
        UV_NO_CONFIG="1",
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_PROGRESS="1",
        # The cache is on the stage's filesystem: its files are linked into the
        # stage, not copied. Hard links are also what keeps `current` intact: where
        # the stage already has a file (linked to `current`'s), uv replaces it by a
        # rename, where a copy would write into the file `current` shares.
        UV_LINK_MODE="hardlink",
    )
    common = ["--python", PYTHON, "--index-url", index, "--quiet"]
    if only_binary:
        common += ["--only-binary", ":all:"]
    rootfs = installed(ROOTFS_SITE)
    layer = installed(os.path.join(CURRENT, SITE))
    named = {name_of(p) for p in packages}

    # 1. Resolve. Constraints: the rootfs's pins, and the layer's for what the
    # request leaves alone. The output file starts as the layer's pins, which uv
    # then prefers: a named package already there stays if it still fits.
    request, constraints, resolved = TMP + "/request.txt", TMP + "/constraints.txt", TMP + "/resolved.txt"
    with open(ROOTFS_PINS) as f:
        pins = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    write_lines(request, packages)
    write_lines(constraints, pins + ["%s==%s" % nv for nv in sorted(layer.items()) if nv[0] not in named])
    write_lines(resolved, ["%s==%s" % nv for nv in sorted(layer.items())])
    try:
        run("resolving", [UV, "pip", "compile", request, "--output-file", resolved, "--constraint", constraints,
                          "--no-header", "--no-annotate", *common], env)
    except Failed:
        for why in image_conflicts(packages, rootfs):
            print("sandboxd: %s" % why, file=sys.stderr)
        raise
    wanted = read_pins(resolved)
    present = {**rootfs, **layer}
    new = sorted((name, version) for name, version in wanted.items() if present.get(name) != version)
    unchanged = sorted(name for name in named if name in wanted and (name, wanted[name]) not in new)
    if not new:
        return {"installed": [], "unchanged": unchanged}

    # 2. Install what is new into a stage that starts as the layer's hard-linked copy.
    if os.path.isdir(CURRENT):
        run("copying the layer", ["cp", "-rl", CURRENT, STAGE])
    else:
        os.mkdir(STAGE)
    run("installing", [UV, "pip", "install", "--prefix", STAGE, "--no-deps", "--compile-bytecode", *common,
                       *("%s==%s" % nv for nv in new)], env)

    # 3. The stage becomes the layer, whole; the old tree goes.
    if os.path.isdir(CURRENT):
        exchange(STAGE, CURRENT)
        clear(STAGE)
    else:
        os.rename(STAGE, CURRENT)
    return {"installed": [{"name": n, "version": str(v)} for n, v in new], "unchanged": unchanged}


def main():
    try:
        request = json.load(sys.stdin)
        # One install at a time per layer (the lock goes with the process): what
        # an install finds of .stage and .tmp is an earlier one's leftovers.
        layer = os.open(LAYER, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(layer, fcntl.LOCK_EX)
        try:
            summary = install(request["packages"], request["index_url"], request["only_binary"])
        except BaseException as e:
            # `current` is as it was (or, past the swap, whole and new): what is
            # left is the stage or the old tree, and uv's files.
            for leftover in (STAGE, TMP):
                try:
                    clear(leftover)
                except OSError:
                    pass  # the next install removes it
            if isinstance(e, Failed) or is_full(e):
                print("sandboxd: %s; %s" % (FULL if is_full(e) else e, AS_IT_WAS), file=sys.stderr)
                sys.exit(1)
            raise
        clear(TMP)
        print(json.dumps(summary))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        print("sandboxd: the installer failed (exit code %d)" % INSTALLER_FAILED, file=sys.stderr)
        sys.exit(INSTALLER_FAILED)


if __name__ == "__main__":
    main()
