"""libsandboxd.so, which pooled templates load inside the rootfs's Python, must not
need libseccomp: the rootfs may lack it, or hold another version. The daemon
compiles the seccomp filter with libseccomp and hands the BPF to every sandbox,
which only loads it (sandboxd/src/isolate/seccomp.rs)."""

import os
import struct
from pathlib import Path


def needed(path):
    """The DT_NEEDED entries of a 64-bit little-endian ELF file, from its section
    headers (.dynamic and the string table it links to)."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + value)
                names.append(data[strtab + value:end].decode())
    return names


def test_the_pool_library_needs_no_libseccomp_and_the_daemon_does():
    daemon = Path(os.environ.get("SANDBOXD_BIN", "target/release/sandboxd")).resolve()
    library = daemon.parent / "libsandboxd.so"
    if not library.exists():
        library = daemon.parent.parent / "lib/sandboxd/libsandboxd.so"
    lib_needs, daemon_needs = needed(library), needed(daemon)
    # The reader sees what a dynamic library needs (so the next assert can fail)...
    assert "libc.so.6" in lib_needs, lib_needs
    assert any(n.startswith("libseccomp.so") for n in daemon_needs), daemon_needs
    # ...and the library loaded inside sandboxes needs no libseccomp.
    assert not [n for n in lib_needs if "seccomp" in n], lib_needs
