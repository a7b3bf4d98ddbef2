"""Outputs that appear whole or not at all, written by one run at a time, never left half-written.

A stage writes into a hidden temporary sibling of its output directory and swaps it into place only when
everything is written, so an interrupted or failed run leaves the previous output exactly as it was:

- **One writer per output.** `output_lock` takes an exclusive `flock` on `.NAME.lock` next to the output for the
  whole stage (the "up to date" decision and the write). A second run on the same output fails at once with a
  message naming the run that holds it, instead of waiting: a convert of a large model takes many minutes, a wait
  would look like a hang, and two runs writing one output (two terminals, two CI jobs, two specs with one
  output_dir) are almost always a mistake whose outcome would be whichever finished last. The lock file is
  removed when the run ends; a killed run's lock is released by the kernel.
- **Leftovers of dead runs are removed.** Temporary (`.NAME.tmp-*`) and moved-aside (`.NAME.old-*`) siblings carry
  the writer's pid and its process start time; the next run on the output removes those whose process is gone
  (or whose pid now belongs to another process), never a live run's.
- **An output that is a symlink is followed.** The user pointed it at another disk: the swap happens beside the
  link's target and the link stays (`output_target`); renaming over the link would replace it with a local
  directory and leave its target as it was.
- **A full filesystem is one message.** ENOSPC/EDQUOT while writing (from any library) becomes a `SpecbuildError`
  naming the directory, the space free and, when the caller knows it, the space needed; with a known size the
  check runs before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psutil

from specbuild.errors import SpecbuildError

MANIFEST = "manifest.json"
NO_SPACE_HINT = "free space on that filesystem, or choose another output_dir (--output), then run again"
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded", "storagefull", "os error 28", "os error 122")
_SPACE_MARGIN = 1 << 20  # metadata and the manifest, on top of what the caller says it writes


class OutputLocked(SpecbuildError):
    """Another run holds the output's lock."""


class NoSpaceError(SpecbuildError):
    """The output's filesystem is full (or the user's quota is used up)."""


# -- who wrote a temporary directory --------------------------------------------------------------------------------
def _start_stamp(pid: int) -> int | None:
    """The process's start time in centiseconds since the epoch (boot time + start ticks: a pid reused by a
    later process gets another stamp); None when there is no such process."""
    try:
        return round(psutil.Process(pid).create_time() * 100)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:  # someone else's process: alive, and not ours to judge
        return -1


def owner_tag() -> str:
    """`<pid>-<start stamp>` of this process, written into every temporary name."""
    return f"{os.getpid()}-{_start_stamp(os.getpid())}"


def _alive(pid: int, stamp: int) -> bool:
    found = _start_stamp(pid)
    return found is not None and found in (stamp, -1)


def _stale_siblings(final: Path, *, untagged: bool = True) -> list[Path]:
    """`.NAME.tmp-*` and `.NAME.old-*` siblings of `final` left by runs that are no longer alive.

    Names without an owner tag (`untagged`) were written by a specbuild older than this file; a caller that holds
    the output's lock, which every current run takes before writing, knows they cannot belong to a live run of
    this version."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(?:tmp|old)-(?:(\d+)-(\d+)-)?[0-9a-z_]+")
    stale = []
    try:
        entries = list(final.parent.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None:
            continue
        pid, stamp = match.group(1), match.group(2)
        if (pid is None and untagged) or (pid is not None and not _alive(int(pid), int(stamp))):
            stale.append(entry)
    return stale


def remove_stale_temporaries(final: Path) -> list[Path]:
    """Remove what dead runs left next to `final`; returns what was removed. Call with the output's lock held.

    A dead run that had moved the previous output aside and not yet put its new one in place (`_swap_in` without
    an exchange) left no `final`: the newest moved-aside output is put back first, so nothing is lost."""
    stale = _stale_siblings(final)
    if not final.exists() and not final.is_symlink():
        moved = [path for path in stale if f".{final.name}.old-" in path.name and path.is_dir()]
        if moved:
            newest = max(moved, key=lambda path: path.stat().st_mtime_ns)
            newest.rename(final)
            stale.remove(newest)
    removed = []
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not path.exists():
            removed.append(path)
    return removed


def output_target(final: Path) -> Path:
    """Where the output `final` really is: a symbolic link there is followed to its target (which need not exist
    yet), so every run on the link writes, locks and cleans up beside the target; any other path is itself."""
    if not final.is_symlink():
        return final
    try:
        return final.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a loop of links
        raise SpecbuildError(f"{final}: the output is a symbolic link that cannot be followed ({err})",
                             hint="point the link at a directory (or where one may be written), or remove it") from err


# -- one writer per output ------------------------------------------------------------------------------------------
_held: dict[Path, list[int]] = {}  # lock path -> [fd, depth]: re-entrant within this process (flock is per open file)
_held_guard = threading.Lock()


def lock_path(final: Path) -> Path:
    return final.parent / f".{final.name}.lock"


def _holder_text(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 65536).decode("utf-8"))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["started"])))
        command = shlex.join(str(part) for part in holder.get("argv") or [])
        where = f" on {holder['host']}" if holder.get("host") not in (None, socket.gethostname()) else ""
        return f"pid {holder['pid']}{where}, running since {started}: `{command}`"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder has not said who it is yet"


def _acquire(path: Path, final: Path, *, wait: bool) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if is_no_space(err):
                raise no_space_error(path.parent) from err
            raise SpecbuildError(f"{path}: cannot create the output's lock file ({err.strerror})") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(fd)
            os.close(fd)
            raise OutputLocked(
                f"{final}: another specbuild run is using this output now ({holder}); lock {path}",
                hint="wait for that run to finish, or stop it, then run again (two runs writing one output would "
                "replace each other's work)",
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its last holder removed after we opened it
            return fd
        os.close(fd)


@contextmanager
def output_lock(final: Path, *, wait: bool = False) -> Iterator[None]:
    """Hold `final`'s lock for the block, first removing what dead runs left next to `final`; a nested call in the
    same process (a stage that locks its outputs before atomic_directory locks each again) is a no-op.

    A held lock is an `OutputLocked` error at once, unless `wait`: then this waits for the holder to finish (the
    demo models, where parallel test sessions should share one build rather than fail). A symlinked output is
    locked at its target (`output_target`), so a run through the link and one on the target exclude each other."""
    final = output_target(final)
    path = Path(os.path.abspath(lock_path(final)))
    with _held_guard:
        if path in _held:
            _held[path][1] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield
        finally:
            with _held_guard:
                _held[path][1] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if is_no_space(err):
            raise no_space_error(path.parent) from err
        raise SpecbuildError(f"{path.parent}: cannot create the output directory ({err.strerror})") from err
    fd = _acquire(path, final, wait=wait)
    try:  # who holds it, for the message a second run prints; best effort (a full disk must not stop the run)
        info = {"pid": os.getpid(), "started": psutil.Process().create_time(), "argv": sys.argv,
                "host": socket.gethostname()}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode("utf-8"))
    except OSError:
        pass
    with _held_guard:
        _held[path] = [fd, 1]
    try:
        remove_stale_temporaries(final)  # ours to judge now: what a killed run left is gone even if nothing is written
        yield
    finally:
        with _held_guard:
            del _held[path]
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it: a later opener then sees a removed file and retries
        os.close(fd)


# -- a full filesystem ----------------------------------------------------------------------------------------------
def is_no_space(err: BaseException | None) -> bool:
    """Whether `err` (or what caused it) is a full filesystem or an exceeded quota, whichever library raised it
    (safetensors and torch wrap the OS error in their own exception types)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in _NO_SPACE_ERRNOS:
            return True
        if any(text in str(err).lower() for text in _NO_SPACE_TEXT):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _free_bytes(directory: Path) -> int | None:
    for candidate in (directory, *directory.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def no_space_error(directory: Path, needed: int | None = None) -> NoSpaceError:
    """The one message for a full filesystem: which directory, what is free, what was needed (if known)."""
    free = _free_bytes(directory)
    parts = [f"{_size(free)} free" if free is not None else None,
             f"about {_size(needed)} needed" if needed else None]
    detail = ", ".join(part for part in parts if part)
    return NoSpaceError(f"{directory}: no space left on the device{f' ({detail})' if detail else ''}",
                        hint=NO_SPACE_HINT + "; the previous output is unchanged")


def check_free_space(directory: Path, needed: int | None) -> None:
    """Refuse before writing when `needed` bytes (plus a little) are not free where `directory` lives."""
    if not needed:
        return
    free = _free_bytes(directory)
    if free is not None and free < needed + _SPACE_MARGIN:
        raise no_space_error(directory, needed + _SPACE_MARGIN)


# -- writing --------------------------------------------------------------------------------------------------------
Inputs = Mapping[str, "Path | str | None"]
"""What a command reads, by the name the user knows it by (an option, a spec field): `{"--base": path}`."""


def _relation(output: Path, source: Path) -> str | None:
    if output == source:
        return "is"
    if output in source.parents:
        return "contains"
    if source in output.parents:
        return "lies inside"
    return None


def refuse_overlap(output: Path, inputs: Inputs, *, output_name: str = "output") -> None:
    """Refuse an output that is, contains or lies inside one of the command's inputs, naming both.

    The atomic swap replaces the output directory whole, so an input inside it would be deleted, and an output
    inside an input would change what the user pointed the command at. Paths are compared both as written
    (absolute: an input reached through a symlink inside the output would lose that link) and resolved (symlinks,
    `..`: `m2` and `./m2/../m2` are the same). Call it before any work; `atomic_directory(inputs=...)` checks
    again under the lock."""
    written = Path(os.path.abspath(output))
    resolved = written.resolve()
    for name, path in inputs.items():
        if path is None:
            continue
        source = Path(os.path.abspath(path))
        relation = _relation(written, source) or _relation(resolved, source.resolve())
        if relation is None:
            continue
        raise SpecbuildError(
            f"{output}: the {output_name} {relation} the input {name} {path}; writing it would "
            f"{'delete' if relation != 'lies inside' else 'change'} that input",
            hint=f"choose another {output_name}, outside {path} and not containing it",
        )


def check_replaceable(final: Path) -> None:
    """Refuse to replace anything specbuild did not write: a file, or a non-empty foreign directory."""
    if not final.exists():
        return
    if not final.is_dir():
        raise SpecbuildError(f"{final}: output path exists and is not a directory", hint="choose another output")
    if any(final.iterdir()) and not (final / MANIFEST).is_file():
        raise SpecbuildError(
            f"{final}: output directory exists, is not empty and was not written by specbuild "
            f"(no {MANIFEST}); refusing to replace it",
            hint="choose another output directory, or remove this one yourself",
        )


def _sibling(final: Path, kind: str) -> Path:
    return final.parent / f".{final.name}.{kind}-{owner_tag()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_directory(final: Path, *, needed_bytes: int | None = None,
                     replaceable: Callable[[Path], None] = check_replaceable,
                     inputs: Inputs | None = None, output_name: str = "output") -> Iterator[Path]:
    """Yield a temporary directory that replaces `final` when the block finishes without error.

    Holds `final`'s lock throughout, first removes what dead runs left next to it, refuses to replace what
    `replaceable` says is not ours (default: `check_replaceable`) or that overlaps one of `inputs`
    (`refuse_overlap`), and refuses before writing when `needed_bytes` (what the caller will write, if it knows)
    are not free. A full filesystem while writing ends in one
    `NoSpaceError`; either way the previous output is untouched and the temporary directory gone. A symlink at
    `final` is followed (`output_target`): its target is replaced, the link stays."""
    final = output_target(final)
    with output_lock(final):
        if inputs:
            refuse_overlap(final, inputs, output_name=output_name)
        replaceable(final)
        check_free_space(final.parent, needed_bytes)
        tmp = _sibling(final, "tmp")
        try:
            tmp.mkdir(mode=0o700)
        except OSError as err:
            if is_no_space(err):
                raise no_space_error(final.parent, needed_bytes) from err
            raise SpecbuildError(f"{final.parent}: cannot create the output directory ({err.strerror})") from err
        old: Path | None = None
        try:
            yield tmp
            tmp.chmod(_directory_mode())  # the output should be readable like any other directory
            old = _swap_in(tmp, final)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if is_no_space(err):
                raise no_space_error(final.parent, needed_bytes) from err
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_EXCHANGE_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM)


def _renameat2() -> Callable[..., int] | None:
    """libc's renameat2 (Linux, glibc 2.28+), or None."""
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (renameat2 RENAME_EXCHANGE): no moment where either name is missing.
    False where the kernel, libc or filesystem cannot (the caller falls back to two renames)."""
    import ctypes

    sys.audit("specbuild.atomic.exchange", str(a), str(b))  # a seam for the kill tests: the swap's one step
    function = _renameat2() if sys.platform.startswith("linux") else None
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _EXCHANGE_UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _swap_in(tmp: Path, final: Path) -> Path | None:
    """Put the complete `tmp` at `final`; returns where the previous output now is (to remove), or None.

    With a previous output the two are exchanged in one step, so a run killed at any moment leaves `final` holding
    the previous output or the new one, whole. Where the filesystem cannot exchange, the previous output is moved
    aside first; a run killed between the two renames leaves no `final`, and the next run on it puts the moved-aside
    previous output back (`remove_stale_temporaries`) before anything else."""
    if not final.exists():
        tmp.rename(final)
        return None
    old = _sibling(final, "old")
    if exchange(tmp, final):
        tmp.rename(old)  # tmp holds the previous output now; named as moved aside, for whoever removes it
        return old
    final.rename(old)
    try:
        tmp.rename(final)
    except BaseException:
        old.rename(final)  # put the previous output back
        raise
    return old


def link_or_copy(source: Path, destination: Path) -> None:
    """Hard-link (instant, no extra space; every stage replaces files rather than rewriting them, so a link never
    sees a later change), else copy (another filesystem, or one without hard links)."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def stage_text(path: Path, text: str) -> Path:
    """Write `text` to a temporary sibling of `path`, with the mode `path` has (or a new file would get), and
    return it; the caller renames it over `path` (`os.replace`) once it is happy with it, so readers see the old
    file or the new one, never half of one. Temporaries of dead runs for the same path are removed first."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if is_no_space(err):
            raise no_space_error(path.parent) from err
        raise
    for stale in _stale_siblings(path, untagged=False):  # no lock here: only tagged names can be judged
        if stale.is_file():
            stale.unlink(missing_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.tmp-{owner_tag()}-",
                                     suffix="", delete=False) as handle:
        temporary = Path(handle.name)
        try:
            handle.write(text)
            handle.flush()
        except BaseException as err:
            handle.close()
            temporary.unlink(missing_ok=True)
            if is_no_space(err):
                raise no_space_error(path.parent, len(text.encode("utf-8"))) from err
            raise
    # NamedTemporaryFile creates 0600; the result should be readable like any file the user writes.
    temporary.chmod(path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
    return temporary


def replace_text(path: Path, text: str, check: Callable[[Path], None] | None = None) -> Path:
    """Replace the file `path` with `text` whole (readers see the old file or the new one), after `check` passed on
    the staged copy; a symbolic link at `path` is followed (`output_target`): its target is replaced, the link
    stays. Nothing is left behind when `check` or the write fails; a write the filesystem refuses (a directory
    there, a parent that is a file, no permission) is a SpecbuildError naming `path`. Returns the file written."""
    target = output_target(path)
    temporary: Path | None = None
    try:
        temporary = stage_text(target, text)
        if check is not None:
            check(temporary)
        os.replace(temporary, target)
    except OSError as err:
        raise SpecbuildError(f"{path}: cannot write it ({err.strerror or err})",
                             hint="name a file in a directory you may write to") from None
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _directory_mode() -> int:
    """The mode `mkdir` would give a new directory under the process's umask."""
    return 0o777 & ~_umask()
