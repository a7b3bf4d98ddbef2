"""Watching a tritonserver's python stubs, and removing what dead servers left behind.

Why `serve` watches the stubs itself (python_backend r24.10, the one in Triton 2.51):
- A stub that dies is neither restarted nor reported. The restart path is gone since r24.06 (python_backend
  27f04d1; `TRITONBACKEND_ModelInstanceExecute` keeps only "TODO: Implement restart on decoupled") and the
  readiness hook that reports "Stub process '<instance>' is not healthy." (`TRITONBACKEND_ModelInstanceReady`)
  came in r26.01 (395a780, #423). So `/v2/health/ready` stays 200 while requests routed to the dead instance fail
  with "Stub process is not healthy." (`ModelInstanceState::SendMessageToStub`) or, when a decoupled stream was in
  flight, never get an answer. The server does not reap the dead stub either: it stays a zombie child of the
  server, whose wait status Linux keeps in /proc/<pid>/stat.
- A stub that dies before its first message (e.g. `std::stol` on a command line split at a space) leaves
  `StubLauncher::Launch` blocked in `parent_message_queue_->Pop()`, which has no timeout: its model stays LOADING.

Shared memory: each stub's region is `<shm-region-prefix-name><uuid>` in /dev/shm, created and unlinked by the
server; a server killed with SIGKILL leaves them. Our prefix is `specbuild_<pid of the starting process>_<hex>_`
(with `r<rank>_` after it for each MPI rank of a sharded server, `launch.rank_shm_prefix`), so a region is stale when
that process is gone and no live process maps or holds it open.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

STUB_BINARY = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
SHM_REGION = re.compile(r"specbuild_(\d+)_[0-9a-f]{8}_")
LINK_DIR = re.compile(r"specbuild-serve-(\d+)-")

LOADING_ZOMBIE_GRACE_S = 15.0
"""A stub the server has not reaped this long while models load is one `Launch` waits for forever; a stub that
exits normally (the auto-complete stub, a failed `initialize`) is reaped at once."""

STUB_FATAL = re.compile(
    r"terminate called after throwing|Failed to preinitialize Python stub|Model path does not look right|"
    r"Expected \d+ arguments|Fatal Python error"
)
"""What a stub prints when it dies before it can talk to the server (pb_stub.cc `main`)."""


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    instance: str
    started: float


@dataclass(frozen=True)
class StubDeath:
    """A stub that died under a running server: which model, and how it ended."""

    pid: int
    model: str | None
    instance: str | None
    how: str
    """'was killed by SIGKILL', 'exited with code 1' or 'died' (when the server already reaped it)."""


@dataclass
class StubWatch:
    """The python stubs under one server process (also under MPI ranks), checked on every `poll`."""

    root: int
    stubs: dict[int, Stub] = field(default_factory=dict)
    _zombie_since: dict[int, float] = field(default_factory=dict)

    def poll(self, *, loading: bool, log: str = "") -> StubDeath | None:
        """A dead stub, if any. While models load a stub may exit normally, so only one left unreaped (the server
        waits for it forever) counts, after `LOADING_ZOMBIE_GRACE_S` or at once when the log shows its crash."""
        try:
            descendants = psutil.Process(self.root).children(recursive=True)
            servers = {self.root} | {p.pid for p in descendants if _name(p) == "tritonserver"}  # MPI ranks
            children = [p for p in descendants if p.pid not in servers and _ppid(p) in servers]
        except psutil.Error:
            return None  # the server itself is gone: its caller reports that
        now = time.monotonic()
        seen = set()
        for child in children:
            seen.add(child.pid)
            try:
                status = child.status()
                if status != psutil.STATUS_ZOMBIE and child.pid not in self.stubs:
                    stub = _stub(child)
                    if stub is not None:
                        self.stubs[child.pid] = stub
            except psutil.Error:
                continue
            if status == psutil.STATUS_ZOMBIE:
                since = self._zombie_since.setdefault(child.pid, now)
                if not loading or now - since >= LOADING_ZOMBIE_GRACE_S or STUB_FATAL.search(log):
                    return self._death(child.pid, exit_status(child.pid))
        for pid in set(self._zombie_since) - seen:
            del self._zombie_since[pid]  # reaped
        for pid, stub in list(self.stubs.items()):
            if pid in seen and (pid in self._zombie_since or _same(pid, stub)):
                continue  # alive, or a zombie still in its grace period (reported above when it ends)
            del self.stubs[pid]
            if not loading:  # after the load nothing unloads (model control mode NONE): only a death reaps one
                return StubDeath(pid, stub.model, stub.instance, "died")
        return None

    def _death(self, pid: int, status: int | None) -> StubDeath:
        stub = self.stubs.get(pid)
        return StubDeath(pid, stub.model if stub else None, stub.instance if stub else None, describe(status))


def _stub(proc: psutil.Process) -> Stub | None:
    """The stub's model and instance from its command line (pb_stub.cc `main`: argv[1] is
    `<repository>/<model>/<version>/model.py`, argv[8] the instance name); None for other processes."""
    args = proc.cmdline()
    if len(args) >= 3 and Path(args[0]).name == "bash" and args[1] == "-c":
        args = args[2].split()  # not exec'd yet: `bash -c " exec <stub> <model path> ..."` (StubLauncher::Launch)
        args = args[1:] if args and args[0] == "exec" else args
    start = next((i for i, arg in enumerate(args[:2]) if arg.endswith(STUB_BINARY)), None)
    if start is None:  # (args[:2]: a stub script runs as `sh <stub> ...`)
        return None
    args = args[start:]
    parts = Path(args[1]).parts if len(args) > 1 else ()
    model = parts[-3] if len(parts) >= 3 else "?"
    return Stub(proc.pid, model, args[8] if len(args) > 8 else model, proc.create_time())


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def _ppid(proc: psutil.Process) -> int | None:
    """(Only the servers' own children are stubs: a model's own subprocesses are not watched.)"""
    try:
        return proc.ppid()
    except psutil.Error:
        return None


def _same(pid: int, stub: Stub) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == stub.started and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exit_status(pid: int) -> int | None:
    """The wait status of a zombie (field 52 of /proc/<pid>/stat, Linux >= 3.5); None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[49])
    except (OSError, IndexError, ValueError):
        return None


def describe(status: int | None) -> str:
    if status is None:
        return "died"
    if status & 0x7F:
        try:
            name = signal.Signals(status & 0x7F).name
        except ValueError:
            name = f"signal {status & 0x7F}"
        return f"was killed by {name}"
    return f"exited with code {(status >> 8) & 0xFF}"


def describe_returncode(code: int) -> str:
    """Popen's returncode in words: negative numbers are signals."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# -- leftovers of dead servers ----------------------------------------------------------------------------------


def remove_stale_shared_memory() -> list[str]:
    """Remove /dev/shm regions of specbuild servers whose starting process is gone and that no live process maps
    or holds open (a SIGKILLed server's, once its stubs have exited). Returns the names removed."""
    if not SHM_DIR.is_dir():
        return []
    candidates = {}
    for region in SHM_DIR.iterdir():
        match = SHM_REGION.match(region.name)
        if match is None or _alive_since(int(match.group(1)), region):
            continue
        with contextlib.suppress(OSError):
            candidates[region.name] = region.lstat()
    if not candidates:
        return []
    in_use = _regions_in_use({stat.st_uid for stat in candidates.values()})
    removed = []
    for name in sorted(candidates):
        if name in in_use or None in in_use:
            continue
        with contextlib.suppress(OSError):
            (SHM_DIR / name).unlink()
            removed.append(name)
    return removed


def _alive_since(pid: int, region: Path) -> bool:
    """Whether process `pid` exists and started before `region` was written (else the pid was reused)."""
    try:
        started = psutil.Process(pid).create_time()
        return started <= region.lstat().st_mtime + 1.0
    except (psutil.Error, OSError):
        return False


def _regions_in_use(owners: set[int]) -> set[str | None]:
    """Names of specbuild regions that some process maps or has open; None in the set when a tritonserver or stub
    of one of `owners` (the regions' uids) could not be inspected, so that nothing is removed on a guess."""
    used: set[str | None] = set()
    where = f"{SHM_DIR}/specbuild_"
    mapped = re.compile(re.escape(str(SHM_DIR)) + r"/(specbuild_\S+)")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            used.update(mapped.findall((proc / "maps").read_text()))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(where):
                    used.add(target[len(str(SHM_DIR)) + 1:])
        except FileNotFoundError:
            continue  # exited meanwhile
        except PermissionError:  # (even root may not read some, e.g. a sandbox's init)
            with contextlib.suppress(OSError):
                comm = (proc / "comm").read_text().strip()
                if proc.stat().st_uid in owners and (comm == "tritonserver" or STUB_BINARY.startswith(comm)):
                    used.add(None)
        except OSError:
            continue
    return used


def remove_stale_link_dirs(parent: Path) -> None:
    """Remove `specbuild-serve-<pid>-*` directories (a plain-path symlink to a repository, see serve/server.py) that
    a process killed before its cleanup left in `parent`: only when that process is gone, and only symlinks."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = LINK_DIR.match(entry.name)
        if match is None or psutil.pid_exists(int(match.group(1))):
            continue
        remove_link_dir(entry)


def remove_link_dir(directory: Path) -> None:
    """Unlink the symlinks in `directory` (never what they point to), then the directory itself."""
    try:
        if directory.is_symlink() or not directory.is_dir() or directory.stat().st_uid != os.getuid():
            return
        for link in directory.iterdir():
            if link.is_symlink():
                link.unlink()
        directory.rmdir()
    except OSError:
        pass
