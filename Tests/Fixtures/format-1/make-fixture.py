#!/usr/bin/env python3
"""How format-1/container was made (2026, Coffer format 1). Kept as a record: never run it again
to replace the fixture (Tests/Fixtures/README.md).

  make-fixture.py populate MNT    fill a freshly mounted, empty container
  make-fixture.py manifest MNT    print the manifest of what the mount shows (JSON)

A symlink target inside the mount is written in the manifest with "{mountpoint}" in place of the
mountpoint (it is stored relative to the mount and read back under whatever mountpoint is used).
"""
import hashlib, json, os, stat, sys

CHUNK = 32768

def data(seed, n):
    """Deterministic bytes, so the content is described by this file too."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(b"%s-%d" % (seed.encode(), counter)).digest()
        counter += 1
    return bytes(out[:n])

# path -> (mtime seconds, mtime nanoseconds), set last (after every namespace change).
TIMES = {
    ".": (1700000000, 100000001),
    "hello.txt": (1700000100, 123456789),
    "empty": (1700000200, 999999999),
    "run.sh": (1700000300, 1),
    "owned.txt": (1700000350, 350350350),
    "sparse.bin": (1700000400, 400000400),
    "hardlink-a": (1700000500, 500500500),
    "link-rel": (1700000600, 600000006),
    "link-outside": (1700000650, 650000065),
    "notes": (1700000700, 700000007),
    "notes/todo.md": (1700000800, 800000008),
    "notes/deep": (1700000900, 900000009),
    "notes/deep/er": (1700001000, 1),
    "notes/deep/er/leaf.bin": (1700001100, 110011001),
    "notes/deep/link-abs": (1700001200, 120012001),
    "shared": (1700001300, 130013001),
}

def populate(mnt):
    p = lambda rel: os.path.join(mnt, rel)
    def write(rel, content, mode):
        with open(p(rel), "wb") as f:
            f.write(content)
        os.chmod(p(rel), mode)

    os.makedirs(p("notes/deep/er"))
    os.mkdir(p("shared"))
    write("hello.txt", b"Hello from Coffer format 1\n", 0o644)
    write("empty", b"", 0o640)
    write("run.sh", b"#!/bin/sh\necho coffer\n", 0o755)
    os.chmod(p("run.sh"), 0o4750)             # set-user-ID and an unusual mode
    write("owned.txt", b"owned by 1000:1000\n", 0o600)
    os.chown(p("owned.txt"), 1000, 1000)
    write("notes/todo.md", b"- freeze the format\n- test it on every build\n", 0o600)
    write("notes/deep/er/leaf.bin", data("leaf", 5000), 0o644)
    write("hardlink-a", data("hard", 3000), 0o644)
    os.link(p("hardlink-a"), p("notes/hardlink-b"))

    # Six whole 32 KiB chunks and a partial seventh; chunks 2 and 3 are a hole (never written),
    # chunk 1 and chunk 4 are partly written.
    with open(p("sparse.bin"), "wb") as f:
        f.write(data("sparse-head", 40000))
        f.seek(150000)
        f.write(data("sparse-tail", 6 * CHUNK + 1000 - 150000))
    os.chmod(p("sparse.bin"), 0o644)

    os.symlink("notes/todo.md", p("link-rel"))
    os.symlink(os.path.join(mnt, "hello.txt"), p("notes/deep/link-abs"))  # stored relative to the mount
    os.symlink("/nonexistent/outside/target", p("link-outside"))          # outside the mount: verbatim

    os.chmod(p("shared"), 0o1777)
    os.chmod(p("notes/deep"), 0o750)
    os.chmod(p("notes/deep/er"), 0o2755)

    os.setxattr(p("hello.txt"), "user.comment", b"format one")
    os.setxattr(p("sparse.bin"), "user.binary", bytes([0, 1, 2, 0xFF, 0, 0x80]))
    os.setxattr(p("sparse.bin"), "user.empty", b"")
    os.setxattr(p("notes"), "user.dir", b"a directory's attribute")
    os.setxattr(p("hardlink-a"), "user.shared", b"seen through both names")

    for rel, (sec, ns) in TIMES.items():
        t = sec * 1_000_000_000 + ns
        os.utime(p(rel), ns=(t, t), follow_symlinks=False)
    os.sync()

def manifest(mnt):
    entries = []
    for dirpath, dirnames, filenames in os.walk(mnt):
        dirnames.sort()
        names = ([""] if dirpath == mnt else []) + sorted(dirnames + filenames)
        for name in names:
            full = os.path.join(dirpath, name) if name else dirpath
            rel = os.path.relpath(full, mnt)
            st = os.lstat(full)
            kind = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink"}[stat.S_IFMT(st.st_mode)]
            e = {
                "path": rel, "type": kind, "mode": "%04o" % stat.S_IMODE(st.st_mode),
                "uid": st.st_uid, "gid": st.st_gid, "size": st.st_size, "nlink": st.st_nlink,
                "mtime": "%d.%09d" % (st.st_mtime_ns // 1_000_000_000, st.st_mtime_ns % 1_000_000_000),
            }
            if kind == "symlink":
                target = os.readlink(full)
                if target.startswith(mnt + "/"):
                    target = "{mountpoint}" + target[len(mnt):]
                    del e["size"]  # the length of the target under this mountpoint
                e["target"] = target
            else:
                e["xattrs"] = {n: os.getxattr(full, n).hex() for n in sorted(os.listxattr(full))}
            if kind == "file":
                e["blocks"] = st.st_blocks  # stored chunks: the hole in sparse.bin is not counted
                with open(full, "rb") as f:
                    e["sha256"] = hashlib.sha256(f.read()).hexdigest()
            entries.append(e)
    entries.sort(key=lambda e: e["path"])
    for e in entries:  # what populate set must be what the mount shows
        sec, ns = TIMES.get(e["path"], (None, None))
        assert sec is None or e["mtime"] == "%d.%09d" % (sec, ns), e
    return {"format": 1, "chunkSize": CHUNK, "password": "password", "container": "container", "entries": entries}

if __name__ == "__main__":
    cmd, mnt = sys.argv[1], os.path.abspath(sys.argv[2])
    if cmd == "populate":
        populate(mnt)
    else:
        json.dump(manifest(mnt), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
