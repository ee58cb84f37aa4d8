# The keeper: what ends an owner's commands when the owner dies without its
# teardown (SIGKILL, the OOM killer, a crash in an extension, os._exit).
#
# Theory of operation. The teardown runs in the owner's process; if that
# process dies first, nothing in it can run. So the first owned command of a
# process starts one small helper for the whole process, the keeper: this
# module, run by the same interpreter as a top-level module (`python -I -S
# -c "...import _keeper; _keeper.serve(OWNER_PID)"`), never importing trio
# or the package. It is ready ~20 ms later and nothing waits for that: the
# pipe holds what the owner writes meanwhile. It runs in a session of its
# own (a signal to the owner's process group or terminal does not reach
# it), with cwd "/", stdout and stderr on /dev/null (it never holds the
# owner's pipes or terminal), a minimal environment (the census and leak
# check cookies, so enclosing owners still see it, and nothing else), and
# every signal another process may end it with ignored (IGNORED_SIGNALS):
# only the end of its owner, or SIGKILL, ends it.
#
# Its stdin is the read end of a pipe whose only writer is the owner, and its
# fd 3 the read end of a second one, the bell. Both write ends are
# close-on-exec and non-blocking in the owner; a forked child closes them at
# once (os.register_at_fork) and every write checks that the writer is still
# the owner's pid, so a child never speaks for its parent. An exec in the
# owner closes them too: for the keeper that is the owner's end.
# The owner writes one line per domain just before the spawn (LEADER_PID
# and LEADER_START 0: a command may kill its owner before the spawn has
# returned, and the cgroup and the census token already find it), one with
# the leader once it is attached, and one when the domain is released; each
# a write, no round trip, a few microseconds:
#
#   open  ID GRACE LEADER_PID LEADER_START TOKEN CGROUP   (tab-separated)
#   lead  ID LEADER_PID LEADER_START
#   close ID
#   bye                     (clean exit with nothing open: end nothing)
#
# The keeper does not wake for these lines: it waits on the bell, on the
# line pipe's hang-up and on the owner's pidfd, never on the lines
# themselves. A wakeup takes CPU from the owner's spawn: measured after
# 50 ms idle on 2 vCPUs, the keeper woken by the line written just before
# the clone cost spawn-and-wait of /bin/true 140-180 us (1.26-1.27 x trio
# against 1.18-1.20 x without a keeper, three runs of 150 interleaved
# rounds, process-group domain); the 50 ms batches of
# earlier versions did not help there, as the first line after a pause
# woke it anyway. So the lines stay in the pipe until the owner rings the
# bell: once RING_AT bytes are unread (~130 commands, a quarter of the
# pipe), and with "bye". The pipe is left at its 64 KiB: a larger one
# counts against the user's pipe-user-pages-soft for as long as the owner
# lives (past that limit, every new pipe of the user's gets 8 KiB). End of file
# without "bye", or the owner's pidfd reporting its exit (which also covers
# a write end leaked to a child that forked without Python's hooks), means
# the owner is gone; everything it wrote is still in the pipe. The keeper
# then runs the library's ladder on every domain still open, all at once
# (end_domains): SIGTERM+SIGCONT, wait up to that command's grace, SIGKILL
# (cgroup.kill where there is one), wait up to KILL_WAIT, remove the
# cgroups, and exits. Its bound is the largest grace it was told plus
# KILL_WAIT, plus the scans.
#
# It never signals anything it was not told about:
# - a cgroup is ours by its unique name; members are signalled through
#   pidfds kept only for pids still listed after the pidfd was opened;
# - the leader's process group is signalled only if the group is provably
#   the command's: its leader is still the recorded process (pid *and* start
#   time), or a live member carries the command's census token (a group id
#   cannot be reused while the group has a member);
# - census escapees (processes carrying the token outside the domain, e.g.
#   after setsid) are signalled through a pidfd after the token was read
#   again. A process that left the domain *and* cleared its environment is
#   invisible here, as it is to the owner's own census.
#
# The ladder (end_domains) and the cgroup and /proc primitives below are
# also what `procown doctor --clean` and the first-use sweep of stale
# cgroups use (_stale.py); they are synchronous and need only the standard
# library. They repeat a few lines of _cgroup and _procfs on purpose: those
# import trio, which would add ~0.2 s to the keeper's start-up.
#
# Limits. The keeper cannot outlive a kill that reaches it too: a cgroup-wide
# kill of the owner's own cgroup (systemd stopping the unit, an enclosing
# owner's cgroup.kill) ends it with the owner; the owner's commands then end
# only if they were in that cgroup's subtree (the default: command cgroups
# are children of the owner's cgroup, and a process-group domain stays in
# the owner's cgroup). A keeper SIGKILLed alone is noticed at the owner's
# next spawn or release (EPIPE on the pipe): a new one is started and told
# every domain still open; receipts say which commands were unguarded.

from __future__ import annotations

import _thread
import errno
import math
import os
import select
import sys
import time
from stat import S_ISFIFO

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable, Iterable

    from ._receipt import KeeperState
else:
    import _signal as signal  # the same functions and numbers, without enum's ~7 ms import

COOKIE_KEY = b"TRIO_PROCOWN_COOKIE="  # _census.COOKIE_VAR (not imported: this file runs alone)
NO_KEEPER_ENV = "TRIO_PROCOWN_NO_KEEPER"
# Environment variables the keeper keeps: the census cookie of enclosing
# owners and the leak check's cookie (so they still see it), and what the
# interpreter itself may need to start.
KEPT_ENV = ("TRIO_PROCOWN_COOKIE", "TRIO_PROCOWN_TEST_COOKIE", "LD_LIBRARY_PATH")

KILL_WAIT = 1.0  # the library's default kill_wait
POLL = 0.02  # how often the ladder looks again while it waits
EXIT_WAIT = 1.0  # how long a clean exit of the owner waits for the keeper to end
RING_AT = 16384  # the owner rings the bell once this many bytes of lines are unread (see serve)
BELL = 3  # the keeper's descriptor of the bell's read end
PIPE_BUF = 4096  # a pipe write up to this size is atomic

HAVE_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
IS_LINUX = sys.platform.startswith("linux")
TERM = (signal.SIGTERM, signal.SIGCONT)
KILL = (signal.SIGKILL,)


# -- /proc --------------------------------------------------------------------------


def _read(path: str, size: int = 4096) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, size)
            chunks.append(chunk)
            if len(chunk) < size:
                return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


class Row:
    """One process of the table: pid, process group, zombie or not, start time."""

    __slots__ = ("pgrp", "pid", "start", "zombie")

    def __init__(self, pid: int, pgrp: int, zombie: bool, start: int) -> None:
        self.pid = pid
        self.pgrp = pgrp
        self.zombie = zombie
        self.start = start  # clock ticks since boot


def stat(pid: int) -> Row | None:
    """`pid`'s row from /proc/PID/stat; None when it is gone."""
    raw = _read(f"/proc/{pid}/stat", 1024)
    if not raw:
        return None
    fields = raw.rpartition(b") ")[2].split(b" ", 20)
    try:
        return Row(pid, int(fields[2]), fields[0] in (b"Z", b"X"), int(fields[19]))
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> int:
    """The start time of `pid` in clock ticks since boot (0: unknown)."""
    row = stat(pid) if IS_LINUX else None
    return row.start if row is not None else 0


def table() -> list[Row]:
    rows = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            row = stat(int(name))
            if row is not None:
                rows.append(row)
    return rows


def carries(pid: int, token: bytes) -> bool:
    """Does `pid`'s environment hold `token` in its census cookie chain?"""
    env = _read(f"/proc/{pid}/environ", 65536)
    if not env:
        return False
    if env.startswith(COOKIE_KEY):
        at = 0
    else:
        at = env.find(b"\0" + COOKIE_KEY) + 1
        if at == 0:
            return False
    end = env.find(b"\0", at)
    value = env[at + len(COOKIE_KEY) : None if end < 0 else end]
    return token in value.split(b":")


def send(pid: int, sigs: tuple[int, ...], still: Callable[[int], bool]) -> int | None:
    """Send `sigs` to `pid` if `still(pid)` holds once a pidfd names it (so
    a recycled pid is never signalled); return the pidfd (the caller closes
    it), or None when nothing was sent."""
    if not HAVE_PIDFD:
        if still(pid):
            try:
                for sig in sigs:
                    os.kill(pid, sig)
            except OSError:
                pass
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        if still(pid):
            for sig in sigs:
                signal.pidfd_send_signal(fd, sig)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def signal_listed(path: str, sigs: tuple[int, ...]) -> None:
    """Send `sigs` to every process of the cgroup tree `path`, each through
    a pidfd kept only if the pid is still listed after it was opened."""
    fds: dict[int, int | None] = {}
    for pid in tree_pids(path):
        try:
            fds[pid] = os.pidfd_open(pid) if HAVE_PIDFD else None
        except OSError:
            continue
    still = set(tree_pids(path))
    for pid, fd in fds.items():
        try:
            if pid in still:
                for sig in sigs:
                    if fd is None:
                        os.kill(pid, sig)
                    else:
                        signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            if fd is not None:
                os.close(fd)


def exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


# -- cgroups ------------------------------------------------------------------------


def populated(path: str) -> bool:
    """ "populated 1" in cgroup.events; False once the cgroup is gone, True
    when it cannot be read (that proves nothing)."""
    raw = _read(os.path.join(path, "cgroup.events"))
    if raw is None:
        return os.path.isdir(path)
    for line in raw.splitlines():
        key, _, value = line.partition(b" ")
        if key == b"populated":
            return value.strip() != b"0"
    return True


def subtree(path: str) -> list[str]:
    """The cgroup `path` and its descendants, deepest first."""
    found = [top for top, _dirs, _files in os.walk(path, topdown=False)]
    return found or [path]


def tree_pids(path: str) -> list[int]:
    pids: list[int] = []
    for where in subtree(path):
        raw = _read(os.path.join(where, "cgroup.procs"), 65536)
        if raw:
            pids.extend(int(x) for x in raw.split() if x.isdigit())
    return pids


def cgroup_kill(path: str) -> bool:
    """Write cgroup.kill (Linux 5.14+); False if it could not be done."""
    try:
        fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def remove_tree(path: str) -> list[str]:
    """rmdir the cgroup `path` and its descendants, deepest first; the ones
    that could not be removed, with why."""
    kept = []
    for where in subtree(path):
        try:
            os.rmdir(where)
        except FileNotFoundError:
            continue
        except OSError as exc:
            kept.append(f"{where} ({errno.errorcode.get(exc.errno or 0, 'error')})")
    return kept


# -- the ladder ---------------------------------------------------------------------


class Entry:
    """One domain as the keeper knows it."""

    __slots__ = ("cgroup", "grace", "leader", "start", "token")

    def __init__(
        self, grace: float, leader: int = 0, start: int = 0, token: str = "", cgroup: str = ""
    ) -> None:
        self.grace = grace
        self.leader = leader  # its pid is the process-group id (0: none)
        self.start = start  # the leader's start time (0: unknown)
        self.token = token  # the census token ("" : none)
        self.cgroup = cgroup  # the cgroup path ("": none)

    def line(self, ident: int) -> bytes:
        fields = ("open", ident, self.grace, self.leader, self.start, self.token, self.cgroup)
        return ("\t".join(map(str, fields)) + "\n").encode(errors="surrogateescape")

    @classmethod
    def parse(cls, fields: list[bytes]) -> Entry | None:
        try:
            grace = max(0.0, float(fields[2]))
            cgroup = os.fsdecode(fields[6])
            return cls(grace, int(fields[3]), int(fields[4]), os.fsdecode(fields[5]), cgroup)
        except (IndexError, ValueError):
            return None


class _Ending:
    """The ladder's state for one entry."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.group = False  # the leader's process group is provably the command's
        self.checked = False
        self.forced = False
        self.hits: dict[int, int] = {}  # census escapees signalled: pid -> pidfd
        self.token = entry.token.encode()

    def _group_is_ours(self, rows: list[Row]) -> bool:
        e = self.entry
        if e.leader <= 1 or e.leader == os.getpgrp():
            return False
        for row in rows:
            if row.pid == e.leader and e.start and row.start == e.start:
                return True  # still the recorded leader (a zombie keeps its pid too)
        token = self.token
        return bool(token) and any(
            r.pgrp == e.leader and not r.zombie and carries(r.pid, token) for r in rows
        )

    def signal(self, sigs: tuple[int, ...], rows: list[Row]) -> None:
        e = self.entry
        if e.cgroup and not (sigs == KILL and cgroup_kill(e.cgroup)):
            signal_listed(e.cgroup, sigs)
        if e.leader > 1:
            if not self.checked:
                self.checked = True
                self.group = self._group_is_ours(rows)
            if self.group:
                for sig in sigs:
                    try:
                        os.killpg(e.leader, sig)
                    except OSError:
                        break
        if self.token:
            self.census(sigs, rows)

    def census(self, sigs: tuple[int, ...], rows: list[Row]) -> None:
        me = os.getpid()
        since = self.entry.start
        for row in rows:
            if row.zombie or row.pid == me or row.start < since:
                continue
            if self.group and row.pgrp == self.entry.leader:
                continue  # the group's signal reached it
            if not carries(row.pid, self.token):
                continue
            fd = send(row.pid, sigs, self.marked)
            if fd is not None:
                old = self.hits.pop(row.pid, None)
                if old is not None:
                    os.close(old)
                self.hits[row.pid] = fd

    def marked(self, pid: int) -> bool:
        row = stat(pid)
        return row is not None and not row.zombie and carries(pid, self.token)

    def empty(self, rows: list[Row]) -> bool:
        e = self.entry
        if e.cgroup and populated(e.cgroup):
            return False
        if self.group and any(r.pgrp == e.leader and not r.zombie for r in rows):
            return False
        return all(exited(fd) for fd in self.hits.values())

    def finish(self) -> str:
        for fd in self.hits.values():
            os.close(fd)
        self.hits.clear()
        if not self.entry.cgroup:
            return ""
        kept = remove_tree(self.entry.cgroup)
        return f"NOT removed: {', '.join(kept)}" if kept else "removed"


def end_domains(entries: Iterable[Entry], kill_wait: float = KILL_WAIT) -> list[str]:
    """End every process of `entries` with the library's ladder, all at
    once; remove their cgroups. Bounded by the largest grace plus
    `kill_wait` (plus the scans). Returns, per entry, what became of its
    cgroup ("removed", "NOT removed: ...", or "" without one)."""
    endings = [_Ending(e) for e in entries]
    started = time.monotonic()
    needs_table = any(e.entry.leader or e.entry.token for e in endings)
    rows = table() if needs_table else []
    for ending in endings:
        ending.signal(TERM, rows)
    last_kill: float | None = None
    try:
        while True:
            rows = table() if any(e.group for e in endings) else []
            live = [e for e in endings if not e.empty(rows)]
            now = time.monotonic()
            if not live:
                break
            if last_kill is not None and all(e.forced for e in live) and now >= last_kill + kill_wait:
                break
            due = [e for e in live if not e.forced and now >= started + e.entry.grace]
            if due:
                rows = table() if needs_table else rows
                for ending in due:
                    ending.forced = True
                    ending.signal(KILL, rows)
                last_kill = now
            time.sleep(POLL)
        if needs_table:
            # What started (or left the domain) while we waited, last: SIGKILL.
            rows = table()
            for ending in endings:
                if ending.token:
                    ending.census(KILL, rows)
    finally:
        outcome = [ending.finish() for ending in endings]
    return outcome


# -- the keeper process -------------------------------------------------------------


def _watch_owner(owner: int) -> int | None:
    """A pidfd on our parent, the owner, if it still is our parent."""
    if not HAVE_PIDFD or owner <= 1 or os.getppid() != owner:
        return None
    try:
        fd = os.pidfd_open(owner)
    except OSError:
        return None
    if os.getppid() != owner:  # it died between the two checks: the fd may name another
        os.close(fd)
        return None
    return fd


def _read_available(fd: int = 0) -> tuple[bytes, bool]:
    """Everything the pipe `fd` holds now (it is non-blocking); and whether
    it reached end-of-file."""
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return b"".join(chunks), False
        except OSError:
            return b"".join(chunks), True
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def take_line(domains: dict[bytes, list[bytes]], line: bytes) -> bool:
    """Apply one of the owner's lines to `domains` (ident -> its open line's
    fields, parsed only if needed); False for "bye"."""
    fields = line.split(b"\t")
    if fields[0] == b"open" and len(fields) >= 7:
        domains[fields[1]] = fields
    elif fields[0] == b"lead" and len(fields) >= 4 and fields[1] in domains:
        domains[fields[1]][3:5] = fields[2:4]
    elif fields[0] == b"close" and len(fields) >= 2:
        domains.pop(fields[1], None)
    elif fields[0] == b"bye":
        return False
    return True


def _bell() -> bool:
    """Is BELL the read end of a pipe (the owner's bell)?"""
    try:
        if not S_ISFIFO(os.fstat(BELL).st_mode):
            return False
        os.set_blocking(BELL, False)
    except OSError:
        return False
    return True


# The signals the keeper ignores: every one whose default action ends a
# process and that comes from another process on purpose. An enclosing
# owner's teardown signals its whole domain, the keeper with it, with its
# own first signal, whichever that is: `procown timeout -s ALRM` around a
# nested procown ended the nested one's keeper with SIGALRM before the
# nested teardown was over. A fault of its own (SEGV, BUS, FPE, ILL, ABRT,
# TRAP, SYS) keeps its default; SIGKILL cannot be ignored.
IGNORED_SIGNALS = tuple(
    getattr(signal, name)
    for name in (
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGTERM",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGPOLL",
        "SIGPWR",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGSTKFLT",
    )
    if hasattr(signal, name)
) + tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


def serve(owner: int) -> int:
    """The keeper's life: wait for the owner's bell or its end, reading its
    lines each time; once it is gone, end every domain still open."""
    os.chdir("/")
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        os.closerange(BELL + 1, os.sysconf("SC_OPEN_MAX"))  # nothing of the owner's stays open here
    except (OSError, ValueError):
        pass
    os.set_blocking(0, False)
    watch = _watch_owner(owner)
    waits = select.poll()
    if _bell():
        waits.register(BELL, select.POLLIN)
        waits.register(0, 0)  # the lines' pipe: its hang-up only (events 0: POLLHUP is reported anyway)
    else:  # started without a bell: every line wakes it
        waits.register(0, select.POLLIN)
    if watch is not None:
        waits.register(watch, select.POLLIN)
    domains: dict[bytes, list[bytes]] = {}  # ident -> its open line's fields, parsed only if needed
    pending = b""
    while True:
        ready = dict(waits.poll())
        if BELL in ready and _read_available(BELL)[1]:
            waits.unregister(BELL)  # rung for the last time: the lines' pipe says the rest
        data, eof = _read_available()  # the owner is gone: everything it wrote is in the pipe
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not take_line(domains, line):
                return 0  # "bye"
        if eof or (watch is not None and watch in ready):
            break
    entries = [e for e in map(Entry.parse, domains.values()) if e is not None]
    if entries:
        end_domains(entries)
    return 0


# -- the owner's side ---------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))


def argv(owner: int) -> list[str]:
    """How the keeper is started: this file imported as a top-level module
    (its cached bytecode is used; a script would be compiled each time),
    isolated (-I: no PYTHON* variables, no user site) and without site (-S)."""
    code = f"import os, sys; sys.path.append({HERE!r}); import _keeper; os._exit(_keeper.serve({owner}))"
    return [sys.executable, "-I", "-S", "-c", code]


def pipe(ends: list[int]) -> tuple[int, int]:
    """A pipe whose read end is numbered above BELL (it is dup'ed onto 0 or
    BELL in the keeper, and onto its own number would stay close-on-exec);
    both ends are appended to `ends` as they are made. The write end is
    non-blocking."""
    import fcntl

    r, w = os.pipe()
    ends += (r, w)
    if r <= BELL:
        low, r = r, fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, BELL + 1)
        ends[ends.index(low)] = r
        os.close(low)
    os.set_blocking(w, False)
    return r, w


def spawn(owner: int, lines: int, bell: int, env: dict[str, str]) -> int:
    """Start a keeper for `owner` (argv), with `lines` as its stdin and
    `bell` as its BELL, both numbered above BELL; its pid."""
    args = argv(owner)
    return os.posix_spawn(
        args[0],
        args,
        env,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, lines, 0),
            (os.POSIX_SPAWN_DUP2, bell, BELL),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
        setsigmask=(),
        setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE),
    )


class Guard:
    """What the keeper was told of one domain, for the receipt."""

    __slots__ = ("closed", "generation", "ident", "note", "state")

    def __init__(self, ident: int, state: KeeperState, note: str = "", generation: int = 0) -> None:
        self.ident = ident
        self.state: KeeperState = state
        self.note = note
        self.generation = generation
        self.closed: tuple[KeeperState, str] | None = None

    def close(self) -> tuple[KeeperState, str]:
        """Tell the keeper the domain is released (once); the receipt's
        statement of what the keeper knew."""
        if self.closed is None:
            self.closed = _closed(self)
        return self.closed


class _Client:
    """This process's keeper, as its owner sees it."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.lock = _thread.allocate_lock()
        self.fd = -1  # write end of the lines' pipe
        self.bell = -1  # write end of the bell
        self.unread = 0  # bytes of lines written since the bell last rang
        self.pid = 0
        self.pidfd: int | None = None
        self.generation = 0
        self.counter = 0
        self.open: dict[int, bytes] = {}  # ident -> its open line (told again to a new keeper)
        self.told: set[int] = set()  # the open domains the current keeper was told of
        self.exit_hook = False

    def write(self, data: bytes, ring: bool = False) -> str:
        """ "ok", "full" (the keeper is not reading) or "gone" (no reader).
        The bell rings once RING_AT bytes are unread, or when `ring`."""
        if self.fd < 0 or os.getpid() != self.owner:
            return "gone"
        try:
            n = os.write(self.fd, data)
        except BlockingIOError:
            n = 0
        except OSError:  # EPIPE: the keeper is gone
            return "gone"
        self.unread += n
        if ring or n < len(data) or self.unread >= RING_AT:
            try:
                os.write(self.bell, b"!")
                self.unread = 0
            except BlockingIOError:
                pass  # rung already, and not answered: the keeper is not reading
            except OSError:
                return "gone"
        return "ok" if n == len(data) else "full"

    def start(self) -> str:
        """Start a keeper and tell it every open domain; "" or why not."""
        ends: list[int] = []
        try:
            lines_r, lines_w = pipe(ends)
            bell_r, bell_w = pipe(ends)
        except OSError as exc:
            for fd in ends:
                os.close(fd)
            return f"no pipe for the keeper: {exc}"
        try:
            pid = spawn(self.owner, lines_r, bell_r, {k: os.environ[k] for k in KEPT_ENV if k in os.environ})
        except Exception as exc:
            os.close(lines_w)
            os.close(bell_w)
            return f"the keeper could not be started: {type(exc).__name__}: {exc}"
        finally:
            os.close(lines_r)
            os.close(bell_r)
        self.fd, self.bell, self.pid, self.unread = lines_w, bell_w, pid, 0
        try:
            self.pidfd = os.pidfd_open(pid) if HAVE_PIDFD else None
        except OSError:
            self.pidfd = None
        self.generation += 1
        if not self.exit_hook:
            import atexit

            atexit.register(at_exit)
            self.exit_hook = True
        # Every open domain, as far as the pipe takes them (64 KiB, ~500
        # lines, before the new keeper reads): one that does not fit is "lost".
        self.told = {ident for ident, line in self.open.items() if self.write(line) == "ok"}
        return ""

    def close_ends(self) -> None:
        """Close our ends of the lines' pipe and of the bell: for the keeper,
        this process's end."""
        for end in (self.fd, self.bell):
            if end >= 0:
                os.close(end)
        self.fd = self.bell = -1

    def forget(self, wait: float = 0.1) -> bool:
        """Close our end and reap the keeper, waiting at most `wait` for it
        to exit; True if it did."""
        self.close_ends()
        pid, fd = self.pid, self.pidfd
        self.pid, self.pidfd = 0, None
        if pid == 0:
            return True
        try:
            if fd is not None:
                poller = select.poll()  # (select(2) refuses a descriptor numbered 1024 or more)
                poller.register(fd, select.POLLIN)
                poller.poll(max(0, math.ceil(wait * 1000)))
            done = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            done = True  # somebody else reaped it
        finally:
            if fd is not None:
                os.close(fd)
        return done

    def tell_open(self, ident: int, line: bytes) -> Guard:
        self.open[ident] = line
        if self.fd >= 0:
            result = self.write(line)
            if result == "ok":
                self.told.add(ident)
                return Guard(ident, "guarded", generation=self.generation)
            if result == "full":
                del self.open[ident]
                return Guard(ident, "unavailable", f"the keeper (pid {self.pid}) is not reading its pipe")
            self.forget()  # gone: start another, told every open domain
        why = self.start() or ("" if ident in self.told else "the new keeper's pipe is full")
        if why:
            del self.open[ident]
            return Guard(ident, "unavailable", why)
        return Guard(ident, "guarded", generation=self.generation)


_client: _Client | None = None
_CREATE = _thread.allocate_lock()


def _current() -> _Client:
    global _client
    with _CREATE:
        if _client is None or _client.owner != os.getpid():
            _client = _Client()
        return _client


def opted_out() -> bool:
    """Is the keeper turned off by TRIO_PROCOWN_NO_KEEPER?"""
    return os.environ.get(NO_KEEPER_ENV, "") not in ("", "0")


def opened(entry: Entry, wanted: bool = True) -> Guard:
    """Tell this process's keeper (started now if there is none, or if the
    last one is gone) of a domain; never raises. One write on the common path."""
    if not wanted:
        return Guard(0, "opted out", "keeper=False")
    if opted_out():
        return Guard(0, "opted out", f"{NO_KEEPER_ENV} is set")
    if not IS_LINUX:
        return Guard(0, "unavailable", "the keeper needs Linux")
    try:
        client = _current()
        with client.lock:
            client.counter += 1
            line = entry.line(client.counter)
            if len(line) > PIPE_BUF or line.count(b"\t") != 6 or line.count(b"\n") != 1:
                return Guard(0, "unavailable", "the domain does not fit one line of the protocol")
            return client.tell_open(client.counter, line)
    except Exception as exc:  # never fail a spawn for the keeper's sake
        return Guard(0, "unavailable", f"{type(exc).__name__}: {exc}")


def attached(guard: Guard, entry: Entry) -> None:
    """Tell the keeper the leader of a domain it was told of before the
    spawn (a short "lead" line; a keeper started later is told the whole
    `entry`); never raises. One write on the common path. A keeper that is
    not reading keeps what it was told (the cgroup and the census token
    still find the command); one that is gone is replaced, and the new one
    told every open domain."""
    client = _client
    if guard.state != "guarded" or client is None or client.owner != os.getpid():
        return
    try:
        with client.lock:
            line = entry.line(guard.ident)
            if guard.ident not in client.open or len(line) > PIPE_BUF:
                return
            client.open[guard.ident] = line
            if client.write(f"lead\t{guard.ident}\t{entry.leader}\t{entry.start}\n".encode()) == "gone":
                client.forget()
                client.start()
    except Exception:  # never fail a spawn for the keeper's sake
        return


def _closed(guard: Guard) -> tuple[KeeperState, str]:
    if guard.state != "guarded":
        return guard.state, guard.note
    client = _client
    if client is None or client.owner != os.getpid():
        return guard.state, guard.note
    try:
        with client.lock:
            if client.open.pop(guard.ident, None) is None:
                return guard.state, guard.note
            told = guard.ident in client.told
            client.told.discard(guard.ident)
            if client.write(f"close\t{guard.ident}\n".encode()) == "gone":
                client.forget()
                if client.open:  # the others are unguarded until a new keeper knows them
                    client.start()
                return "lost", ""
            if client.generation != guard.generation:
                return ("replaced" if told else "lost"), ""
            return "guarded", ""
    except Exception as exc:
        return guard.state, f"telling the keeper: {type(exc).__name__}: {exc}"


def current_pid() -> int:
    """The pid of this process's keeper, or 0 when none runs."""
    client = _client
    return client.pid if client is not None and client.owner == os.getpid() else 0


def retire(wait: float = EXIT_WAIT) -> bool:
    """Say goodbye to this process's keeper if no domain is open, and wait
    at most `wait` for it to exit; it is forgotten either way (a later
    command starts a new one). False if domains are open (it stays) or it
    did not exit in time."""
    client = _client
    if client is None or client.owner != os.getpid() or client.fd < 0:
        return True
    with client.lock:
        if client.open:
            return False
        client.write(b"bye\n", ring=True)
        return client.forget(wait)


def at_exit() -> None:
    """At the owner's exit (atexit, or _exit.exit_now before os._exit): with
    nothing open, goodbye, and wait (bounded) so that no keeper outlives its
    owner. With domains still open (a trio run in a daemon thread, say),
    just close: the keeper ends them."""
    client = _client
    if client is None or client.owner != os.getpid() or client.fd < 0:
        return
    if client.open:
        client.close_ends()
        return
    retire()


def _after_fork_in_child() -> None:
    global _client, _CREATE
    client, _client = _client, None
    _CREATE = _thread.allocate_lock()  # another thread may have held it at the fork
    if client is not None:
        for fd in (client.fd, client.bell, client.pidfd):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
