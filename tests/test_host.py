"""The host check (`sandboxd check`, GET /v1/check, `sandboxctl doctor`, the daemon's
refusal to start) and rootfs/build.sh's answers to a host that cannot build."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import BIN, CTL, REPO, TARBALL, scratch_dir

ITEMS = ["kernel", "Landlock", "seccomp", "user namespaces", "AppArmor userns restriction", "cgroups",
         "loop devices", "free space", "rootfs", "uid range", "open files"]
BUILD = REPO / "rootfs" / "build.sh"


def sidecar_sha():
    real = Path(os.path.realpath(TARBALL))
    return Path(str(real) + ".sha256").read_text().strip()


def mounts_under(path):
    path = str(path)
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4] == path or line.split()[4].startswith(path + "/")]


@pytest.fixture
def tiny_fs():
    """A 64 MiB tmpfs: too small for a rootfs build or a daemon's state."""
    d = scratch_dir("tiny-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0711", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=True)
    shutil.rmtree(d)


def test_check_prints_every_requirement_and_the_rootfs_hash():
    tmp = scratch_dir("check-")
    out = subprocess.run([str(BIN), "check", "--rootfs-tarball", str(TARBALL), "--state-dir", str(tmp / "state")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    for name in ITEMS:
        assert any(line[2:].startswith(name) for line in lines if line[:1] in "✓!✗"), (name, out.stdout)
    assert not any(line.startswith("✗") for line in lines), out.stdout
    rootfs_line = next(line for line in lines if line[2:].startswith("rootfs"))
    assert rootfs_line.startswith("✓") and sidecar_sha() in rootfs_line, rootfs_line
    assert "content sha256:" in rootfs_line, rootfs_line
    # The state directory does not exist yet: free space is measured on its parent, nothing is made.
    assert f"MiB free in {tmp}" in out.stdout, out.stdout
    assert not (tmp / "state").exists()
    shutil.rmtree(tmp)


def test_check_fails_naming_a_missing_rootfs():
    tmp = scratch_dir("check-")
    out = subprocess.run([str(BIN), "--rootfs-tarball", str(tmp / "none.tar.zst"), "check"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out
    line = next(line for line in out.stdout.splitlines() if line[2:].startswith("rootfs"))
    assert line.startswith("✗") and "not found" in line, out.stdout
    assert "rootfs/build.sh" in out.stdout and "fix the items marked ✗" in out.stdout, out.stdout
    shutil.rmtree(tmp)


def test_daemon_refuses_to_start_on_a_failing_item_and_makes_nothing(tiny_fs):
    # 64 MiB free is below the 512 MiB the daemon needs for workspaces.
    state = tiny_fs / "state"
    out = subprocess.run(
        [str(BIN), "--state-dir", str(state), "--socket", str(tiny_fs / "s.sock"), "--http", "off",
         "--rootfs-tarball", str(TARBALL), "--instance", "sdtest-hostcheck"],
        capture_output=True, text=True, timeout=60, cwd=str(REPO),
    )
    assert out.returncode == 1, out
    assert "the host cannot run sandboxes: free space:" in out.stderr, out.stderr
    assert f"MiB free in {tiny_fs}" in out.stderr and "at least 512 MiB" in out.stderr, out.stderr
    assert "sandboxd check" in out.stderr, out.stderr
    assert list(tiny_fs.iterdir()) == [], "the refused daemon made something"


def test_doctor_and_v1_check_over_the_socket(daemon):
    with daemon.uds() as c:
        r = c.get("/v1/check")
        assert r.status_code == 200
        report = r.json()
        doc = c.get("/v1/openapi.json").json()
    assert report["ok"] is True, report
    assert [i["name"] for i in report["items"]] == ITEMS
    assert all(i["status"] in ("ok", "warn") for i in report["items"]), report
    assert all(i["fix"] for i in report["items"] if i["status"] != "ok"), report
    assert "/v1/check" in doc["paths"] and "get" in doc["paths"]["/v1/check"]
    out = subprocess.run([str(CTL), "--socket", str(daemon.socket), "doctor"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    assert "sandboxd can run sandboxes on this host." in out.stdout, out.stdout
    for item in report["items"]:
        mark = {"ok": "✓", "warn": "!", "fail": "✗"}[item["status"]]
        assert any(line.startswith(f"{mark} {item['name']}") for line in out.stdout.splitlines()), (item, out.stdout)
    # No daemon: doctor says it cannot reach one, and fails.
    out = subprocess.run([str(CTL), "--socket", "/nonexistent.sock", "doctor"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "cannot reach sandboxd" in out.stderr, out


def build(out_dir, env=None, user=None, timeout=600):
    cmd = [str(BUILD), str(out_dir)]
    if user:
        cmd = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_build_refuses_when_not_root_with_one_line_and_nothing_made():
    tmp = scratch_dir("build-")
    out = build(tmp / "out", user=65534)
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "not running as root" in lines[0] and "sudo" in lines[0], out.stderr
    assert not (tmp / "out").exists()
    shutil.rmtree(tmp)


def test_build_refuses_too_little_disk_with_one_line_and_nothing_made(tiny_fs):
    out = build(tiny_fs / "out")
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "MiB free in" in lines[0] and "needs 4096 MiB" in lines[0] and "another directory" in lines[0], lines[0]
    assert list(tiny_fs.iterdir()) == []
    assert mounts_under(tiny_fs) == [str(tiny_fs)]


def test_build_without_the_debian_mirror_names_the_url_and_the_variable_and_leaves_nothing():
    tmp = scratch_dir("build-")
    mirror = "http://127.0.0.1:9/debian"
    out = build(tmp / "out", env={"SANDBOXD_DEBIAN_MIRROR": mirror, "SANDBOXD_ROOTFS_CACHE": str(tmp / "cache")})
    assert out.returncode == 1, out
    assert "FAILED at step 1/8 (debootstrap)" in out.stderr, out.stderr
    assert mirror in out.stderr and "SANDBOXD_DEBIAN_MIRROR" in out.stderr, out.stderr
    assert [p.name for p in (tmp / "out").iterdir()] == [".build.lock"], list((tmp / "out").iterdir())
    assert mounts_under(tmp) == []
    shutil.rmtree(tmp)


def test_build_without_the_package_index_names_the_url_and_the_variable_and_leaves_nothing():
    """Reaches the wheels step (debootstrap from the real mirror, .debs from the shared
    cache), then finds no index: no wheel is cached, so it must ask the index."""
    shared = Path(os.environ.get("SANDBOXD_TEST_ROOTFS_CACHE", os.path.dirname(os.path.realpath(TARBALL))))
    if not (shared / "debs").is_dir():
        pytest.skip(f"no .deb cache in {shared} (set SANDBOXD_TEST_ROOTFS_CACHE)")
    tmp = scratch_dir("build-")
    cache = tmp / "cache"
    cache.mkdir()
    (cache / "debs").symlink_to(shared / "debs")
    if (shared / "pip").is_dir():
        (cache / "pip").symlink_to(shared / "pip")
    index = "http://127.0.0.1:9/simple"
    out = build(tmp / "out", env={"SANDBOXD_PIP_INDEX_URL": index, "SANDBOXD_ROOTFS_CACHE": str(cache)}, timeout=900)
    assert out.returncode == 1, out
    assert "FAILED at step 2/8 (wheels)" in out.stderr, out.stderr
    assert index in out.stderr and "SANDBOXD_PIP_INDEX_URL" in out.stderr, out.stderr
    assert [p.name for p in (tmp / "out").iterdir()] == [".build.lock"], list((tmp / "out").iterdir())
    assert mounts_under(tmp) == []
    assert list((cache / "wheels").iterdir()) == []
    shutil.rmtree(tmp)
