"""sandboxd's package installer: installs packages into the session's package layer.

Run by sandboxd as `/opt/py/bin/python /opt/sandboxd/sandboxd_install.py` in a
sandbox of the session (as the sandbox user, its network through the egress proxy,
the layer mounted read-write at /opt/packages, no workspace), with one JSON object
on stdin:

    {"packages": ["requests==2.32.3", "tabulate"], "index_url": "https://pypi.org/simple",
     "plain_index_url": "http://pypi.org:443/simple/", "only_binary": true,
     "uv_seed": {"path": "interpreter-v5/<hex>/<hex>.msgpack", "data": "<base64>"}}

The requirements are already checked by the daemon (names, extras and version
specifiers only). The layer's live tree is /opt/packages/current, in pip's --prefix
layout (lib/python3.11/site-packages, bin), which every Python of the session puts
on sys.path after the rootfs's own packages (sitecustomize.add_packages_layer).

1. The stage: a hard-linked copy of `current`, so a package already in the layer
   at another version is replaced in the stage and nowhere else; beside the
   layer's packages, a stand-in for each of the rootfs's (its dist-info directory
   with only its METADATA), so that uv counts them as installed.
2. One `uv pip install --prefix` into the stage resolves against the index and
   installs only what neither the rootfs nor the layer holds, constrained to the
   rootfs's versions (/opt/sandboxd/constraints.txt: they cannot be replaced) and
   to the layer's for packages the request does not name (earlier installs stay
   consistent); a package the request names keeps its version in the layer if
   that still satisfies the request (as pip's "already satisfied"). Wheels only
   unless `only_binary` is false. The stand-ins go; what is new is compiled to
   bytecode here, in this process (uv would start interpreters for it; runs
   write none: PYTHONDONTWRITEBYTECODE keeps the workspace clean of it).
3. Swap the stage and `current` in one step (renameat2 RENAME_EXCHANGE), then
   remove the old tree. A failed or killed install leaves `current` as it was;
   what it left (.stage, .tmp) is removed by the next install.

`plain_index_url`, when the daemon gives one, is the same index asked in plain
HTTP, which the egress proxy carries to it over TLS (the way from here to the
proxy is a loopback socket of the sandbox's own): uv then starts no TLS, whose
set-up costs it more than the rest of a cached install. uv's messages name the
index as `index_url`.

uv's cache and temporary files are on the layer's filesystem (.tmp), not /tmp (a
small tmpfs), and are removed afterwards. `uv_seed`, when the daemon has one, is
uv's record of the rootfs's Python, which uv would otherwise ask the interpreter
for (an interpreter started for it, at each install): the daemon made it with
`--probe` (below) in a sandbox of its own, with no session's layer. uv's messages
go to stderr as they are. Exit codes: 0, and the last line on stdout is
`{"installed": [{"name", "version"}], "unchanged": [names already satisfied]}`;
1, the install failed and the layer is as it was (stderr says why: uv's words,
then a line of ours); 70 (EX_SOFTWARE), the installer itself failed (a traceback
on stderr).

`--probe` (no stdin) prints `{"path", "data"}`: the file uv keeps of what it
learnt of /opt/py/bin/python, under its cache, and its bytes in base64.
"""

import errno
import fcntl
import json
import os
import re
import shutil
import sys

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
    more than the rest of this script): canonical name -> version, as the name
    writes it. A project with two of them (pip leaves the old one behind when it
    replaces a package of the layer: it uninstalls nothing outside its
    environment, /opt/py), or with no version, counts as absent: an install that
    needs it puts it back whole."""
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
        if name in found or not VERSION.fullmatch(version):
            absent.add(name)
        found[name] = version
    return {name: version for name, version in found.items() if name not in absent}


# A version as a dist-info directory's name carries it (PEP 440's characters;
# packaging's own parser costs this script a tenth of its time to import).
VERSION = re.compile(r"[0-9][0-9A-Za-z.!+_]*")


def clear(path):
    """Remove what an earlier install left at `path`, if anything."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def is_full(err):
    """Whether `err` says the layer's filesystem has no room left."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def run(what, argv, env=None, shown=()):
    """Run a program (found on PATH) for the step `what`, with no input and its
    output dropped; its messages go to our stderr, each (url, as_shown) of `shown`
    replaced. Failed if it fails. (posix_spawn, not subprocess: whose import
    costs more than the rest of this script's.)"""
    errors, write_end = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ if env is None else env, file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, write_end, 2)])
    finally:
        os.close(write_end)
        os.close(devnull)
    with os.fdopen(errors, "rb") as f:
        messages = f.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    shown_messages = messages
    for url, as_shown in shown:
        shown_messages = shown_messages.replace(url, as_shown)
    sys.stderr.write(shown_messages)
    if code != 0:
        if "No space left on device" in messages or "Disk quota exceeded" in messages:
            raise Failed(FULL)
        raise Failed("%s failed (exit code %d)" % (what, code))


def exchange(a, b):
    """Swap the trees at `a` and `b` in one step (renameat2 RENAME_EXCHANGE)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), b)


def write_lines(path, lines):
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines)


def image_conflicts(packages, rootfs):
    """The requirements that no version the rootfs holds can meet: why a
    resolution failed, in words the user can act on (uv names only the pin)."""
    from packaging.requirements import Requirement  # only when a resolution failed
    from packaging.version import InvalidVersion, Version

    conflicts = []
    for requirement in map(Requirement, packages):
        held = rootfs.get(canonicalize_name(requirement.name))
        try:
            meets = held is None or requirement.specifier.contains(Version(held), prereleases=True)
        except InvalidVersion:
            meets = True
        if not meets:
            conflicts.append("%s is part of the sandbox's image at %s, which cannot be replaced" % (requirement.name, held))
    return conflicts


# uv's record of an interpreter, under its cache: `interpreter-v<N>/<hex>/<hex>.msgpack`.
SEED_PATH = re.compile(r"interpreter-v[0-9]{1,4}/[0-9a-f]{1,64}/[0-9a-f]{1,64}\.msgpack")
SEED_MAX = 1 << 20
# Processes that compile a large install's bytecode.
COMPILE_WORKERS = 4


def plant_seed(seed, cache):
    """Put the daemon's record of the rootfs's Python where uv looks for it, so
    uv asks the interpreter nothing. A seed of another form, or one that cannot
    be written, is left out: uv then asks, as without one."""
    import base64
    import binascii

    path = seed.get("path") if isinstance(seed, dict) else None
    data = seed.get("data") if isinstance(seed, dict) else None
    if not (isinstance(path, str) and SEED_PATH.fullmatch(path) and isinstance(data, str) and len(data) < SEED_MAX):
        return
    target = os.path.join(cache, path)
    try:
        record = base64.b64decode(data, validate=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(record)
    except (binascii.Error, ValueError, OSError):
        clear(target)


def probe():
    """`--probe`: uv's record of /opt/py/bin/python, as it keeps it in its cache."""
    import base64
    import glob

    cache = "/tmp/sandboxd-uv-probe"
    clear(cache)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env.update(UV_CACHE_DIR=cache, UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", UV_OFFLINE="1")
    run("asking uv about the interpreter", [UV, "python", "find", PYTHON], env)
    found = [p for p in glob.glob(cache + "/interpreter-v*/*/*.msgpack") if SEED_PATH.fullmatch(os.path.relpath(p, cache))]
    if len(found) != 1:
        raise Failed("uv kept %d records of the interpreter, not one" % len(found))
    with open(found[0], "rb") as f:
        data = f.read()
    clear(cache)
    return {"path": os.path.relpath(found[0], cache), "data": base64.b64encode(data).decode()}


def stand_ins(site, rootfs_site, skip):
    """A stand-in in `site` for each package of the rootfs that `skip` (what the
    layer holds) does not name: its dist-info directory with only its METADATA,
    which uv reads to count it installed (it does not follow links to the
    rootfs's own). The paths made, for `remove_stand_ins`."""
    made = []
    for entry in os.listdir(rootfs_site):
        if not entry.endswith(".dist-info"):
            continue
        name = canonicalize_name(entry[: -len(".dist-info")].partition("-")[0])
        target = os.path.join(site, entry)
        if name in skip or os.path.lexists(target):
            continue
        os.mkdir(target)
        made.append(target)
        shutil.copyfile(os.path.join(rootfs_site, entry, "METADATA"), os.path.join(target, "METADATA"))
    return made


def empty_tree(path):
    """Whether `path` holds directories only (the layer as every Python of the
    session makes it: its site directory, empty)."""
    return not any(files for _, _, files in os.walk(path))


def remove_stand_ins(made):
    for path in made:
        clear(path)


def compile_bytecode(site, dists):
    """Compile the .py files the dist-info directories `dists` (in `site`) list in
    their RECORD, as pip and uv's --compile-bytecode do; a file that does not
    compile (Python 2 syntax in an old package) is left as it is, as they leave it."""
    import csv

    files = []
    for dist in dists:
        try:
            with open(os.path.join(site, dist, "RECORD"), newline="") as f:
                rows = list(csv.reader(f))
        except OSError:
            continue
        for row in rows:
            if row and row[0].endswith(".py"):
                path = os.path.normpath(os.path.join(site, row[0]))
                if path.startswith(site + os.sep) and os.path.isfile(path):
                    files.append(path)
    # Many files: a few worker processes (the CPUs this process may run on, at
    # most COMPILE_WORKERS: the sandbox's cgroup limits CPU time and processes,
    # which the host's CPU count does not know). Bytecode never fails an install:
    # what a pool does not compile, this process does.
    workers = min(COMPILE_WORKERS, len(os.sched_getaffinity(0)))
    if len(files) > 200 and workers > 1:
        try:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(workers) as pool:
                list(pool.map(compile_one, files, chunksize=32))
            return
        except Exception:
            pass
    for path in files:
        compile_one(path)


def compile_one(path):
    import py_compile

    try:
        py_compile.compile(path, doraise=True)
    except (py_compile.PyCompileError, OSError, ValueError, SyntaxError):
        pass


def install(packages, index, plain_index, only_binary, seed):
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
    if seed:
        plant_seed(seed, TMP + "/cache")
    rootfs = installed(ROOTFS_SITE)
    layer = installed(os.path.join(CURRENT, SITE))
    named = {name_of(p) for p in packages}

    # 1. The stage: the layer's hard-linked copy, and the rootfs's stand-ins.
    if os.path.isdir(CURRENT) and not empty_tree(CURRENT):
        run("copying the layer", ["cp", "-rl", CURRENT, STAGE])
    stage_site = os.path.join(STAGE, SITE)
    os.makedirs(stage_site, exist_ok=True)
    # The session's code may have made links of the layer's directories: the
    # stage's site directory must be the stage's, not one of `current`'s.
    if not os.path.realpath(stage_site).startswith(os.path.realpath(STAGE) + os.sep) or os.path.islink(STAGE):
        raise Failed("%s in the session's package layer is a link: remove it (or the layer's files) and install again" % SITE)
    made = stand_ins(stage_site, ROOTFS_SITE, set(layer))
    before = set(os.listdir(stage_site))

    # 2. Resolve and install. Constraints: the rootfs's pins, and the layer's for
    # what the request leaves alone.
    request, constraints = TMP + "/request.txt", TMP + "/constraints.txt"
    with open(ROOTFS_PINS) as f:
        pins = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    write_lines(request, packages)
    write_lines(constraints, pins + ["%s==%s" % nv for nv in sorted(layer.items()) if nv[0] not in named])
    argv = [UV, "pip", "install", "--prefix", STAGE, "--python", PYTHON, "--index-url", plain_index or index,
            "--quiet", "--requirements", request, "--constraint", constraints]
    if only_binary:
        argv += ["--only-binary", ":all:"]
    shown = [(plain_index.rstrip("/"), index.rstrip("/"))] if plain_index else []
    try:
        run("installing", argv, env, shown)
    except Failed:
        for why in image_conflicts(packages, rootfs):
            print("sandboxd: %s" % why, file=sys.stderr)
        raise
    remove_stand_ins(made)
    clear(os.path.join(STAGE, ".lock"))
    after = installed(stage_site)
    new = sorted((name, version) for name, version in after.items() if layer.get(name) != version)
    replaced = [name for name, _ in new if name in rootfs]
    if replaced:
        # The constraints forbid it; were it done, the rootfs's copy would still be
        # the one imported.
        raise Failed("uv replaced %s, which the sandbox's image holds" % ", ".join(replaced))
    unchanged = sorted(name for name in named if name not in dict(new))
    if not new:
        clear(STAGE)
        return {"installed": [], "unchanged": unchanged}
    compile_bytecode(stage_site, sorted(set(os.listdir(stage_site)) - before))

    # 3. The stage becomes the layer, whole; the old tree goes.
    if os.path.isdir(CURRENT):
        exchange(STAGE, CURRENT)
        clear(STAGE)
    else:
        os.rename(STAGE, CURRENT)
    return {"installed": [{"name": n, "version": v} for n, v in new], "unchanged": unchanged}


def main():
    try:
        if sys.argv[1:] == ["--probe"]:
            print(json.dumps(probe()))
            return
        request = json.load(sys.stdin)
        # One install at a time per layer (the lock goes with the process): what
        # an install finds of .stage and .tmp is an earlier one's leftovers.
        layer = os.open(LAYER, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(layer, fcntl.LOCK_EX)
        try:
            plain_index = request.get("plain_index_url")
            if not (isinstance(plain_index, str) and plain_index.startswith("http://")):
                plain_index = None
            summary = install(request["packages"], request["index_url"], plain_index, request["only_binary"],
                              request.get("uv_seed"))
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
        import traceback

        traceback.print_exc()
        print("sandboxd: the installer failed (exit code %d)" % INSTALLER_FAILED, file=sys.stderr)
        sys.exit(INSTALLER_FAILED)


if __name__ == "__main__":
    main()
