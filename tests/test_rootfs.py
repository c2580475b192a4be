"""The rootfs as the daemon sees it: unpacked once, verified, never used half-done."""

import json
import os
import shutil
import subprocess

from harness import BIN, SHARED_ROOTFS, TARBALL, cgroup_roots, scratch_dir


def start_fails(tmp_path, tarball, state=None):
    state = state or tmp_path / "state"
    out = subprocess.run(
        [str(BIN), "--state-dir", str(state), "--socket", str(tmp_path / "s.sock"), "--http", "off",
         "--rootfs-tarball", str(tarball), "--instance", "sdtest-rootfs"],
        capture_output=True, text=True, timeout=120, cwd=str(BIN.parents[2]),
    )
    assert out.returncode == 1, out
    return out.stderr


def test_manifest_lists_python_and_every_package(daemon):
    with daemon.http() as c:
        sha = c.get("/v1/health").json()["rootfs_sha256"]
    # The image is keyed by the tarball's hash; the daemon mounts it on mnt/rootfs.
    assert (daemon.state / "rootfs" / f"{sha}.img").is_file()
    manifest = json.loads((daemon.state / "mnt/rootfs/opt/sandboxd/manifest.json").read_text())
    assert manifest["python_version"].startswith("3.11.")
    assert manifest["content_hash"].startswith("sha256:")
    names = {p["name"].lower() for p in manifest["packages"]}
    for pkg in ["numpy", "pandas", "scipy", "scikit-learn", "matplotlib", "seaborn", "pillow", "openpyxl", "pyarrow", "reportlab"]:
        assert pkg in names, pkg
    assert all(p["version"] for p in manifest["packages"])
    # The tarball's own hash is the key of the unpacked tree.
    sidecar = (TARBALL.parent / (os.path.realpath(TARBALL).rsplit("/", 1)[1] + ".sha256")).read_text().strip()
    assert sidecar == sha


def test_half_unpacked_rootfs_is_removed_and_never_used(fresh_daemon):
    # A half-unpacked tree and a half-made image of a process that is gone.
    partial = SHARED_ROOTFS / ".partial-deadbeef-4194303"
    (partial / "opt").mkdir(parents=True, exist_ok=True)
    partial_image = SHARED_ROOTFS / ".partial-deadbeef-4194303.img"
    partial_image.write_bytes(b"\0" * 4096)
    d = fresh_daemon()
    assert not partial.exists()
    assert not partial_image.exists()
    assert d.run("print('fine')")["stdout"] == "fine\n"


def test_damaged_or_missing_tarball_is_refused_with_the_cause():
    tmp_path = scratch_dir("rootfs-")
    fake = tmp_path / "rootfs.tar.zst"
    fake.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(4096))
    (tmp_path / "rootfs.tar.zst.sha256").write_text("0" * 64 + "\n")
    err = start_fails(tmp_path, fake)
    assert "rootfs.tar.zst" in err and ("damaged" in err or "unpacking" in err), err
    assert not any(p.name.startswith(".partial-") for p in (tmp_path / "state" / "rootfs").iterdir())
    assert not (tmp_path / "state" / "rootfs" / ("0" * 64 + ".img")).exists()
    assert not (tmp_path / "state" / "mnt" / "rootfs" / "opt").exists()
    err = start_fails(tmp_path, tmp_path / "missing.tar.zst")
    assert "not found" in err and "rootfs/build.sh" in err, err
    # A start that failed leaves none of the instance's cgroup directories.
    left = [str(root / "sdtest-rootfs") for root in cgroup_roots() if (root / "sdtest-rootfs").exists()]
    assert left == [], left
    shutil.rmtree(tmp_path)
