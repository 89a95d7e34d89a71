"""What a disk may hold after a power loss, rebuilt from the recorder's log (recorder.c).

The model of the disk:
- A file's data: a write is volatile until an fsync or fdatasync of that file returns; after that
  it is durable. At a crash, each volatile write survives or not in pieces of 4 KiB sectors (the
  file's 4 KiB grid), each piece on its own, in any combination; the last write before the crash
  may also be torn inside its last sector, at a 512-byte boundary (a prefix of the sector new,
  the rest old). A volatile ftruncate survives or not in order with the file's other truncations
  (a prefix of them: file systems journal metadata in order). Bytes past the old end that no
  surviving write covers read as zeros.
- The directory (the state directory only): a creation, unlink or rename is volatile until the
  directory itself is fsynced (strict POSIX, `--directory-model posix`, the default), or with
  `--directory-model ext4` also until the created file is fsynced (ext4 commits the journal that
  holds the new entry). Volatile directory operations survive as a prefix, in order.
- `sync_file_range` syncs nothing (it gives no durability). The -shm file is left out of every
  crash state: SQLite keeps only its WAL index there, rebuilds it when the first connection opens,
  and writes it through mmap, which the recorder does not see.

A crash point p is "just before the recorded call p" (calls in ticket order): everything of the
calls before p is as the model allows, nothing of p and after. Each state chooses at random (from
the printed seed) the surviving prefix of directory operations, a keep rate for volatile sectors
(none, all, or a random rate), and, with that rate, which sectors survive.
"""

import mmap
import os
import random

SECTOR = 4096
TEAR_UNIT = 512


class Op:
    __slots__ = ("ticket", "ns", "kind", "fd", "a", "b", "data", "path", "path2")

    def __init__(self, fields):
        self.ticket = int(fields[0])
        self.ns = int(fields[1])
        self.kind = fields[2]
        self.fd = int(fields[3])
        self.a = int(fields[4])
        self.b = int(fields[5])
        self.data = int(fields[6])
        self.path = fields[7] if len(fields) > 7 else ""
        self.path2 = fields[8] if len(fields) > 8 else ""


def read_log(trace):
    ops = []
    if not os.path.exists(os.path.join(trace, "ops.log")):
        return ops
    with open(os.path.join(trace, "ops.log")) as log:
        for line in log:
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 7:
                ops.append(Op(fields))
    ops.sort(key=lambda op: op.ticket)
    return ops


class File:
    """One file (an inode): its durable bytes and the volatile changes since its last sync."""

    __slots__ = ("durable", "pending")

    def __init__(self, content=b""):
        self.durable = bytearray(content)
        self.pending = []  # ("w", offset, length, data offset, op index) or ("t", length, op index)

    def sync(self, data):
        for change in self.pending:
            apply(self.durable, change, data, 0, None)
        self.pending = []


def apply(content, change, data, start, end):
    """Applies a write's bytes [start, end) of the write (all of it when end is None), or a
    truncation, to `content`."""
    if change[0] == "t":
        length = change[1]
        if length < len(content):
            del content[length:]
        else:
            content.extend(bytes(length - len(content)))
        return
    _, offset, length, at, _ = change
    if end is None:
        end = length
    begin = offset + start
    if len(content) < begin:
        content.extend(bytes(begin - len(content)))
    content[begin:offset + end] = data[at + start:at + end]


DIRECTORY = object()


class Disk:
    """The recorded calls replayed one by one, keeping what is durable and what is not."""

    def __init__(self, trace, initial, directory_model):
        self.ops = read_log(trace)
        path = os.path.join(trace, "data.bin")
        self.data = b""
        if os.path.exists(path) and os.path.getsize(path):
            with open(path, "rb") as data:
                self.data = mmap.mmap(data.fileno(), 0, prot=mmap.PROT_READ)
        self.ext4 = directory_model == "ext4"
        self.durable_names = {name: File(content) for name, content in initial.items()}
        self.live_names = dict(self.durable_names)
        self.directory_pending = []  # ("create", name, File) / ("unlink", name) / ("rename", old, new)
        self.descriptors = {}
        self.position = 0
        self.problems = []

    def advance(self, to):
        """Replays calls up to (not including) `to`."""
        while self.position < to:
            self.replay(self.ops[self.position], self.position)
            self.position += 1

    def replay(self, op, index):
        kind = op.kind
        if kind == "write":
            target = self.descriptors.get(op.fd)
            if isinstance(target, File):
                target.pending.append(("w", op.a, op.b, op.data, index))
            else:
                self.problems.append(f"write to an unknown descriptor at {index}")
        elif kind == "trunc":
            target = self.descriptors.get(op.fd)
            if isinstance(target, File):
                target.pending.append(("t", op.a, index))
        elif kind in ("fsync", "fdatasync"):
            target = self.descriptors.get(op.fd)
            if op.a != 0:
                return
            if target is DIRECTORY:
                self.commit_directory(len(self.directory_pending))
            elif isinstance(target, File):
                target.sync(self.data)
                if self.ext4:
                    last = max((i for i, entry in enumerate(self.directory_pending)
                                if entry[0] == "create" and entry[2] is target), default=-1)
                    self.commit_directory(last + 1)
        elif kind == "open":
            if op.path == "":
                self.descriptors[op.fd] = DIRECTORY
                return
            if op.b == 1 or op.path not in self.live_names:
                file = File()
                self.live_names[op.path] = file
                self.directory_pending.append(("create", op.path, file))
            file = self.live_names[op.path]
            if op.a & os.O_TRUNC and op.b != 1:
                file.pending.append(("t", 0, index))
            self.descriptors[op.fd] = file
        elif kind == "close":
            self.descriptors.pop(op.fd, None)
        elif kind == "unlink":
            self.live_names.pop(op.path, None)
            self.directory_pending.append(("unlink", op.path))
        elif kind == "rename":
            file = self.live_names.pop(op.path, None)
            if file is not None:
                self.live_names[op.path2] = file
            self.directory_pending.append(("rename", op.path, op.path2))
        elif kind == "arrive":
            self.problems.append(f"a file was moved into the state directory at {index}: its content is unknown")

    def commit_directory(self, count):
        apply_directory(self.durable_names, self.directory_pending[:count])
        del self.directory_pending[:count]

    def crash_state(self, rng, tear_index):
        """What the disk may hold now: {name: bytes} and a short description of the choices."""
        kept_directory = rng.randint(0, len(self.directory_pending))
        names = dict(self.durable_names)
        apply_directory(names, self.directory_pending[:kept_directory])
        mode = rng.choice(("none", "all", "random", "random"))
        rate = {"none": 0.0, "all": 1.0}.get(mode, rng.random())
        files = {}
        volatile = kept = 0
        for name, file in sorted(names.items()):
            if name.endswith("-shm"):
                continue
            content = bytearray(file.durable)
            truncations = sum(1 for change in file.pending if change[0] == "t")
            kept_truncations = {"none": 0, "all": truncations}.get(mode, rng.randint(0, truncations))
            seen_truncations = 0
            for change in file.pending:
                if change[0] == "t":
                    seen_truncations += 1
                    if seen_truncations <= kept_truncations:
                        apply(content, change, self.data, 0, None)
                    continue
                _, offset, length, _, index = change
                start = 0
                while start < length:
                    end = min(length, (offset + start) // SECTOR * SECTOR + SECTOR - offset)
                    volatile += 1
                    if rate >= 1.0 or rng.random() < rate:
                        if index == tear_index and end == length and rng.random() < 0.5:
                            end = start + rng.randint(0, (end - start - 1) // TEAR_UNIT) * TEAR_UNIT
                        if end > start:
                            apply(content, change, self.data, start, end)
                            kept += 1
                    start = end
            files[name] = bytes(content)
        description = (f"directory ops kept {kept_directory}/{len(self.directory_pending)}, "
                       f"sectors {mode} (kept {kept} of {volatile} volatile)")
        return files, description


def apply_directory(names, operations):
    for entry in operations:
        if entry[0] == "create":
            names[entry[1]] = entry[2]
        elif entry[0] == "unlink":
            names.pop(entry[1], None)
        elif entry[0] == "rename":
            file = names.pop(entry[1], None)
            if file is not None:
                names[entry[2]] = file


def crash_points(ops, count, rng):
    """`count` crash points (indices 0...len(ops)), sorted: half at random over all calls, half
    next to the calls that decide durability (syncs, truncations, directory operations), where
    the interesting states are; the end (after the last call) always."""
    last = len(ops)
    decisive = sorted({i + delta for i, op in enumerate(ops) if op.kind in ("fsync", "fdatasync", "trunc", "unlink",
                                                                            "rename", "open")
                       for delta in (0, 1)} - {last})
    chosen = [last]
    if count - 1 <= last:
        pool = set(range(last))
        near = rng.sample(decisive, min(len(decisive), (count - 1) // 2))
        chosen += near
        pool.difference_update(chosen)
        chosen += rng.sample(sorted(pool), count - len(chosen))
    else:
        chosen += [rng.randint(0, last) for _ in range(count - 1)]
    return sorted(chosen)
