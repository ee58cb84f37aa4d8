"""The cgroup placement shim is trusted only when it can be (_placement.py).

Each test points XDG_CACHE_HOME at a fresh directory under one that only
root or we can write, so the cache the shim would come from is under the
test's control, and forgets the process's shim before and after.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ignoring_sigchld, py
from trio_procown import _placement

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the placement shim is for Linux cgroups"
    ),
    pytest.mark.skipif(
        shutil.which("cc") is None, reason="no C compiler: there is no compiled shim to trust"
    ),
    pytest.mark.timeout(120),
]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")

NOBODY = 65534


def _only_root_or_us_can_write(path: str) -> bool:
    here = "/"
    for part in ["", *os.path.realpath(path).split("/")[1:]]:
        here = os.path.join(here, part)
        st = os.lstat(here)
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return False
    return True


@pytest.fixture
def trusted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh directory that only root or we can change, all the way up."""
    for candidate in (os.path.expanduser("~/.cache"), os.path.expanduser("~")):
        if os.path.isdir(candidate) and _only_root_or_us_can_write(candidate):
            break
    else:
        pytest.skip("no directory here that only root or we can write")
    top = Path(tempfile.mkdtemp(prefix="procown-test-placement-", dir=candidate)).resolve()
    private_tmp = top / "tmp"  # where private builds go
    private_tmp.mkdir()
    monkeypatch.delenv(_placement.SH_SHIM_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    _placement.compiled_shim.cache_clear()
    try:
        yield top
    finally:
        _placement.compiled_shim.cache_clear()
        shutil.rmtree(top)


def use_cache_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    """Point XDG_CACHE_HOME at `home`; return the shim's cache directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home / "trio_procown"


def cached_name() -> str:
    return _placement._cache_name(_placement._sources())


def plant_script(path: Path, marker: Path) -> None:
    """A root-owned 0755 script at `path` that would betray its run by `marker`."""
    path.write_text(f'#!/bin/sh\necho swapped >"{marker}"\n')
    path.chmod(0o755)


def run_through_shim(where: Path) -> bool:
    """Spawn a command through shim_argv; True if the command ran."""
    ran = where / "ran"
    argv = _placement.shim_argv(os.devnull, ["/bin/sh", "-c", f'echo ran >"{ran}"'])
    subprocess.run(argv, stdin=subprocess.DEVNULL, start_new_session=True, timeout=30, check=False)
    return ran.exists()


def exec_target(shim: str | None) -> str:
    """The file a /proc/PID/fd/N shim path names (the shim must be one)."""
    assert shim is not None
    assert shim.startswith(f"/proc/{os.getpid()}/fd/")
    return os.readlink(shim)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777], ids=["group", "others", "sticky"])
def test_writable_cache_dir_is_not_trusted(trusted: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    """A cache directory writable by group or others (sticky or not) is never the shim's source."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    cache.mkdir(parents=True)
    marker = trusted / "marker"
    plant_script(cache / cached_name(), marker)
    cache.chmod(mode)

    target = exec_target(_placement.compiled_shim())
    assert not target.startswith(str(cache))
    assert run_through_shim(trusted)
    assert not marker.exists()
    assert os.listdir(trusted / "tmp") == []  # the private build directory is gone


@pytest.mark.parametrize("mode", [0o777, 0o1777], ids=["writable", "sticky"])
def test_writable_ancestor_makes_cache_untrusted(
    trusted: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """A group/other-writable directory anywhere above the cache makes it untrusted."""
    (trusted / "open").mkdir()
    cache = use_cache_home(monkeypatch, trusted / "open" / "xdg")
    cache.mkdir(parents=True, mode=0o700)
    marker = trusted / "marker"
    plant_script(cache / cached_name(), marker)
    (trusted / "open").chmod(mode)

    target = exec_target(_placement.compiled_shim())
    assert not target.startswith(str(cache))
    assert run_through_shim(trusted)
    assert not marker.exists()


def test_symlinked_cache_dir_is_refused(trusted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symlink planted as the cache directory is neither followed for the shim nor written through."""
    elsewhere = trusted / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    marker = trusted / "marker"
    plant_script(elsewhere / cached_name(), marker)
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    cache.parent.mkdir()
    cache.symlink_to(elsewhere)
    before = sorted(os.listdir(elsewhere))

    target = exec_target(_placement.compiled_shim())
    assert not target.startswith((str(cache), str(elsewhere)))
    assert run_through_shim(trusted)
    assert not marker.exists()
    assert sorted(os.listdir(elsewhere)) == before


def test_symlinked_cached_file_is_refused(trusted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symlink planted as the cached shim is not followed: a real build replaces it."""
    marker = trusted / "marker"
    plant_script(trusted / "script", marker)
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    cache.mkdir(parents=True, mode=0o700)
    (cache / cached_name()).symlink_to(trusted / "script")

    target = exec_target(_placement.compiled_shim())
    assert target != str(trusted / "script")
    assert not os.path.islink(cache / cached_name())
    assert run_through_shim(trusted)
    assert not marker.exists()


@needs_root
@pytest.mark.parametrize("owned", ["file", "directory"])
def test_shim_owned_by_another_user_is_refused(
    trusted: Path, monkeypatch: pytest.MonkeyPatch, owned: str
) -> None:
    """A cached shim, or cache directory, owned by another uid (not root, not us) is never exec'd."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    cache.mkdir(parents=True, mode=0o755)
    marker = trusted / "marker"
    planted = cache / cached_name()
    plant_script(planted, marker)
    os.chown(planted if owned == "file" else cache, NOBODY, NOBODY)
    planted_inode = os.stat(planted).st_ino
    if owned == "file":
        assert _placement._open_checked(str(planted), planted.lstat()) is None

    shim = _placement.compiled_shim()
    exec_target(shim)
    assert shim is not None
    st = os.stat(shim)
    assert st.st_uid in (0, os.geteuid())
    assert st.st_ino != planted_inode
    assert run_through_shim(trusted)
    assert not marker.exists()


def test_trusted_cache_is_exec_through_the_verified_descriptor(
    trusted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trusted cache gives /proc/PID/fd/N on the verified file; a later swap of the file changes nothing."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    shim = _placement.compiled_shim()
    cached = cache / cached_name()
    assert exec_target(shim) == str(cached)
    assert shim is not None
    assert (os.stat(shim).st_dev, os.stat(shim).st_ino) == (cached.stat().st_dev, cached.stat().st_ino)

    marker = trusted / "marker"
    plant_script(trusted / "swap", marker)
    os.replace(trusted / "swap", cached)
    assert _placement.compiled_shim() == shim
    assert run_through_shim(trusted)
    assert not marker.exists()


def test_descriptor_must_be_the_checked_inode(trusted: Path) -> None:
    """The file opened for exec must be the very inode that was checked, and a regular executable file."""
    first, second = trusted / "first", trusted / "second"
    for path in (first, second):
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    fd = _placement._open_checked(str(first), first.lstat())
    assert fd is not None
    os.close(fd)
    assert _placement._open_checked(str(first), second.lstat()) is None
    os.mkfifo(trusted / "fifo", 0o755)
    assert _placement._open_checked(str(trusted / "fifo"), (trusted / "fifo").lstat()) is None
    (trusted / "link").symlink_to(first)
    assert _placement._open_checked(str(trusted / "link"), first.lstat()) is None


def test_cache_dir_is_created_private(trusted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache directory is created with mode 0700 and then used."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    exec_target(_placement.compiled_shim())
    assert stat.S_IMODE(cache.lstat().st_mode) == 0o700
    assert (cache / cached_name()).is_file()


def test_command_does_not_inherit_the_shim_descriptor(trusted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The descriptor kept for the shim is close-on-exec: the command never sees it."""
    use_cache_home(monkeypatch, trusted / "xdg")
    target = exec_target(_placement.compiled_shim())
    argv = _placement.shim_argv(os.devnull, ["/bin/sh", "-c", "ls -l /proc/self/fd/"])
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True)
    assert target.encode() not in done.stdout
    assert b"cgroup_shim" not in done.stdout


def test_forked_child_opens_its_own_shim(trusted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After os.fork the child execs the shim through its own descriptor, not the parent's."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    exec_target(_placement.compiled_shim())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.close(r)
            shim = _placement.compiled_shim()
            ok = (
                shim is not None
                and shim.startswith(f"/proc/{os.getpid()}/fd/")
                and os.readlink(shim) == str(cache / cached_name())
                and run_through_shim(trusted)
            )
            os.write(w, b"ok" if ok else repr(shim).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            said = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert said == b"ok"


def test_descriptor_closed_behind_our_back_is_opened_again(
    trusted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If our descriptor is closed and its number reused for another file, the shim is opened again."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    shim = _placement.compiled_shim()
    exec_target(shim)
    assert shim is not None
    number = int(shim.rsplit("/", 1)[1])
    other = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(other, number)  # closes ours, as code that closes every descriptor would
        again = _placement.compiled_shim()
        assert again != shim
        assert exec_target(again) == str(cache / cached_name())
        assert run_through_shim(trusted)
    finally:
        os.close(other)
        os.close(number)


def test_untrusted_cache_without_compiler_uses_the_shell_shim(
    trusted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the cache untrusted and no C compiler, the /bin/sh shim is used, never the cached file."""
    cache = use_cache_home(monkeypatch, trusted / "xdg")
    cache.mkdir(parents=True)
    marker = trusted / "marker"
    plant_script(cache / cached_name(), marker)
    cache.chmod(0o777)
    monkeypatch.setenv("PATH", str(trusted / "no-compiler-here"))

    assert _placement.compiled_shim() is None
    assert _placement.shim_argv(os.devnull, ["/bin/true"])[0] == "/bin/sh"
    assert run_through_shim(trusted)
    assert not marker.exists()


# -- the spawner (clone3 into the cgroup) ----------------------------------------


def _spawner_name() -> str:
    return _placement._cache_name(_placement._sources(_placement._SPAWNER_BUILDS), "spawn_into")


@pytest.fixture
def fresh_spawner(trusted: Path) -> Iterator[Path]:
    _placement.compiled_spawner.cache_clear()
    try:
        yield trusted
    finally:
        _placement.compiled_spawner.cache_clear()


def test_a_trial_of_the_spawner_works_when_the_status_is_lost() -> None:
    """A trial's exit status cannot be read when the program ignores SIGCHLD: the spawner that
    ran the program still counts as working (no rebuild in every such process)."""
    path = _placement.compiled_spawner()
    if path is None:
        pytest.skip("no spawner on this machine")
    assert _placement.spawner_trial("/bin/sh", ["sh", "-c", "exit 7"], -1, 10) == 7
    with ignoring_sigchld():
        assert _placement.spawner_trial("/bin/sh", ["sh", "-c", "exit 7"], -1, 10) == _placement.STATUS_LOST


@pytest.mark.parametrize("mode", [0o770, 0o1777], ids=["group", "sticky"])
def test_spawner_in_a_writable_cache_is_not_loaded(
    fresh_spawner: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """The spawner is a shared object we load into our own process: the
    same trust as the shim's. One planted in a cache that others can write
    is never loaded; a private build is used instead."""
    cache = use_cache_home(monkeypatch, fresh_spawner / "xdg")
    cache.mkdir(parents=True)
    planted = cache / _spawner_name()
    planted.write_bytes(b"\x7fELF not a library")
    planted.chmod(0o755)
    cache.chmod(mode)
    path = _placement.compiled_spawner()
    assert path is not None
    assert not os.readlink(path).startswith(str(cache))


_ENVIRON = [k + b"=" + v for k, v in os.environb.items()]


def _spawn_and_read(
    argv: list[str], cwd: str | None = None, env: list[bytes] = _ENVIRON
) -> tuple[int, bytes]:
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pid, pidfd, _ = _placement.spawn_into(argv[0], argv, env, cwd, (null, w, w), -1)
    finally:
        os.close(w)
        os.close(null)
    try:
        with os.fdopen(r, "rb") as f:
            out = f.read()
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out
    finally:
        os.close(pidfd)


def test_spawner_gives_what_subprocess_gives(fresh_spawner: Path) -> None:
    """A command started by the spawner sees what subprocess gives it: a new
    session, stdio only (nothing else inherited, close_fds), no blocked
    signals, SIGPIPE and SIGXFSZ at their defaults, the cwd asked for."""
    inheritable = os.open(os.devnull, os.O_RDONLY)  # inheritable: close_fds must still close it
    try:
        os.set_inheritable(inheritable, True)
        script = (
            'ls /proc/self/fd; grep -E "^(SigBlk|SigIgn)" /proc/self/status; '
            "ps -o sid= -o pgid= -p $$; echo pid $$; pwd"
        )
        status, out = _spawn_and_read(["/bin/sh", "-c", script], cwd="/")
    finally:
        os.close(inheritable)
    assert status == 0, out
    lines = out.decode().split("\n")
    fds = sorted(int(x) for x in lines if x.strip().isdigit())
    assert fds == [0, 1, 2, 3], out  # 3: ls's own directory
    blocked = next(x for x in lines if x.startswith("SigBlk")).split()[1]
    ignored = int(next(x for x in lines if x.startswith("SigIgn")).split()[1], 16)
    assert int(blocked, 16) == 0
    for sig in (13, 25):  # SIGPIPE, SIGXFSZ
        assert not ignored & (1 << (sig - 1)), hex(ignored)
    pid = next(x for x in lines if x.startswith("pid ")).split()[1]
    sid, pgid = next(x for x in lines if len(x.split()) == 2 and x.split()[0].isdigit()).split()
    assert sid == pgid == pid
    assert lines[-2] == "/"


def test_spawner_reports_the_exec_error(fresh_spawner: Path) -> None:
    """A program that cannot run raises the OSError subprocess raises, and nothing is left."""
    tmp_path = fresh_spawner  # not pytest's tmp_path: `trusted` moves tempfile's directory
    with pytest.raises(FileNotFoundError):
        _spawn_and_read([str(tmp_path / "missing")])
    text = tmp_path / "text"
    text.write_text("not a program\n")
    text.chmod(0o644)
    with pytest.raises(PermissionError):
        _spawn_and_read([str(text)])
    with pytest.raises(FileNotFoundError) as bad_cwd:
        _spawn_and_read(["/bin/true"], cwd=str(tmp_path / "nowhere"))
    assert bad_cwd.value.filename == str(tmp_path / "nowhere")


def test_spawner_keeps_stdio_given_in_any_order(fresh_spawner: Path) -> None:
    """Stdio sources that are themselves 0, 1 or 2 are not clobbered by an earlier dup2."""
    r, w = os.pipe()
    saved = os.dup(1)
    try:
        # stdout -> our pipe through fd 0's slot: stdin = the pipe's write end is odd, so
        # give stderr = fd 1 (the pipe) and stdout = fd 1 as well, stdin = /dev/null.
        os.dup2(w, 1)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid, pidfd, _ = _placement.spawn_into(
                "/bin/sh", ["sh", "-c", "echo out; echo err >&2"], _ENVIRON, None, (null, 1, 1), -1
            )
        finally:
            os.close(null)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    os.close(pidfd)
    assert out == b"out\nerr\n"


def test_spawner_environment_is_the_one_given_each_time(fresh_spawner: Path) -> None:
    """The environment array is reused between spawns that share all but their last entry
    (the census cookie): each command still sees exactly its own environment, also when the
    shared part changes or the environment is empty."""

    def env_of(env: list[bytes]) -> list[bytes]:
        status, out = _spawn_and_read(["/bin/cat", "/proc/self/environ"], env=env)
        assert status == 0
        return out.split(b"\0")[:-1]

    base = [b"A=1", b"B=2"]
    assert env_of([*base, b"COOKIE=x"]) == [*base, b"COOKIE=x"]
    assert env_of([*base, b"COOKIE=yy"]) == [*base, b"COOKIE=yy"]  # the cached head, a new tail
    assert env_of([b"A=1", b"B=3", b"COOKIE=z"]) == [b"A=1", b"B=3", b"COOKIE=z"]  # a changed head
    assert env_of([b"A=1", b"COOKIE=z"]) == [b"A=1", b"COOKIE=z"]  # a shorter one
    assert env_of([]) == []
    with pytest.raises(ValueError, match="null byte"):
        env_of([b"A=1", b"B=\0", b"COOKIE=z"])


# -- the leader's start time from the clock around the clone (start_tick) ------------------


def test_start_tick_is_the_tick_only_when_the_bracket_lies_well_inside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel stamps the start between the two clock reads and reports it rounded down to
    a tick: a bracket inside one tick (BORN_MARGIN clear of both edges) is that tick; one that
    comes near an edge, a reversed or unread bracket, or an unknown tick length is unknown (0)."""
    monkeypatch.setattr(_placement, "_tick_ns", lambda: 10_000_000)
    margin = _placement.BORN_MARGIN
    assert _placement.start_tick(1_234 * 10_000_000 + margin, 1_235 * 10_000_000 - margin - 1) == 1_234
    assert _placement.start_tick(1_234 * 10_000_000 + margin - 1, 1_234 * 10_000_000 + 5_000_000) == 0
    assert _placement.start_tick(1_234 * 10_000_000 + 5_000_000, 1_235 * 10_000_000 - margin) == 0
    assert _placement.start_tick(1_234 * 10_000_000 + 5_000_000, 1_234 * 10_000_000 + 4_000_000) == 0
    assert _placement.start_tick(0, 1_234 * 10_000_000 + 5_000_000) == 0
    monkeypatch.setattr(_placement, "_tick_ns", lambda: 0)
    assert _placement.start_tick(1_234 * 10_000_000 + 5_000_000, 1_234 * 10_000_000 + 5_000_100) == 0


def test_the_spawners_start_times_are_the_kernels(fresh_spawner: Path) -> None:
    """Every start time the spawner reports is the one /proc/PID/stat gives (0: left to that
    read), and it reports most of them (a bracket of ~0.1 ms falls across a 10 ms tick
    rarely)."""
    from trio_procown import _procfs

    known = 0
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(200):
            pid, pidfd, start = _placement.spawn_into(
                "/bin/true", ["true"], _ENVIRON, None, (null, null, null), -1
            )
            try:
                info = _procfs.read_stat(pid)
                assert info is not None
                assert start in (0, info.start)
                known += start != 0
            finally:
                os.waitpid(pid, 0)
                os.close(pidfd)
    finally:
        os.close(null)
    assert known >= 100


def test_a_leader_knows_its_start_from_the_spawn_without_reading_proc(
    fresh_spawner: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start time the spawner knew is the leader's: no /proc/PID/stat read for it; an unknown
    one (0) is read when first asked."""
    from trio_procown import _leader, _procfs

    real = _procfs.read_stat
    reads: list[int] = []

    def read_stat(pid: int) -> _procfs.ProcInfo | None:
        reads.append(pid)
        return real(pid)

    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    leaders: list[_leader.Leader] = []
    try:
        for _ in range(20):  # a bracket across a tick (~1 %) leaves the start unknown: try again
            leaders.append(
                _leader.Leader.spawn(
                    ["sleep", "30"],
                    executable="/bin/sleep",
                    stdin=null,
                    stdout=null,
                    stderr=null,
                    cwd=None,
                    env=_ENVIRON,
                )
            )
            if leaders[-1]._start is not None:
                break
        leader = leaders[-1]
        assert leader._start is not None
        expected = real(leader.pid)
        assert expected is not None
        monkeypatch.setattr(_procfs, "read_stat", read_stat)
        assert leader.start == expected.start
        assert reads == []
        leader._start = None  # as after a spawn whose bracket crossed a tick
        assert leader.start == expected.start
        assert reads == [leader.pid]
    finally:
        os.close(null)
        for each in leaders:
            each.kill_now()
            each.reap()
            each.close()


@pytest.mark.parametrize("cleared", [1, 0], ids=["kernel-reset", "child-reset"])
def test_handled_signals_are_reset_and_ignored_ones_stay_ignored(
    fresh_spawner: Path, monkeypatch: pytest.MonkeyPatch, cleared: int
) -> None:
    """Whether the kernel resets the handlers at the clone (CLONE_CLEAR_SIGHAND) or the child
    does it signal by signal (a kernel older than 5.5), the command gets what subprocess gives:
    a signal we handle is at its default, one we ignore stays ignored, SIGPIPE and SIGXFSZ are
    at their defaults, nothing is blocked."""
    import ctypes

    path = _placement.compiled_spawner()
    assert path is not None
    flag = ctypes.c_int.in_dll(ctypes.CDLL(path), "procown_clear_sighand")
    saved = flag.value
    old_usr1 = signal.signal(signal.SIGUSR1, lambda *_: None)
    old_usr2 = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    old_pipe = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    flag.value = cleared
    try:
        status, out = _spawn_and_read(
            ["/bin/sh", "-c", 'grep -E "^(SigBlk|SigIgn|SigCgt)" /proc/self/status']
        )
        assert flag.value == cleared  # this kernel takes the flag: the mode asked for ran
    finally:
        flag.value = saved
        signal.signal(signal.SIGUSR1, old_usr1)
        signal.signal(signal.SIGUSR2, old_usr2)
        signal.signal(signal.SIGPIPE, old_pipe)
    assert status == 0, out
    fields = {line.split(":")[0]: int(line.split()[1], 16) for line in out.decode().splitlines()}
    assert fields["SigBlk"] == 0
    assert fields["SigIgn"] & (1 << (signal.SIGUSR2 - 1))
    for sig in (signal.SIGUSR1, signal.SIGPIPE, signal.SIGXFSZ):
        assert not fields["SigIgn"] & (1 << (sig - 1)), hex(fields["SigIgn"])


def test_first_command_of_a_process_with_many_files_open() -> None:
    """A process whose first owned command comes when it has more than 1024
    descriptors open (a busy server) runs it: the spawner's trial, the
    keeper and the teardown never use select(2), which refuses such
    descriptors."""
    code = (
        "import os, resource, sys, trio, trio_procown\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))\n"
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]\n"
        "for domain in ('auto', 'process-group'):\n"
        "    r = trio.run(lambda: trio_procown.run_owned(['/bin/sh', '-c', 'echo ok'], domain=domain))\n"
        "    out = r.stdout.strip().decode()\n"
        "    print(domain, r.receipt.cause, r.returncode, out, r.receipt.domain_empty)\n"
    )
    done = subprocess.run(py(code), capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["auto exited 0 ok True", "process-group exited 0 ok True"]
    assert b"Traceback" not in done.stderr, done.stderr.decode()


def test_spawn_array_types_survive_a_collection() -> None:
    """The ctypes array types a spawn uses are kept alive: ctypes holds them
    only weakly, so without our reference a full collection frees them and
    the next spawn builds them again (a reference cycle per type)."""
    import ctypes
    import gc
    import weakref

    kind = _placement._array_type(ctypes.c_char_p, 3)
    alive = weakref.ref(kind)
    del kind
    gc.collect()
    assert alive() is not None
    assert _placement._array_type(ctypes.c_char_p, 3) is alive()


def test_long_array_types_are_not_kept() -> None:
    """An array longer than the kept lengths is built, not kept: a program
    running commands of ever-new lengths does not grow the table."""
    import ctypes

    n = _placement._ARRAY_TYPES_MAX_LEN + 1
    kind = _placement._array_type(ctypes.c_char_p, n)
    assert kind._length_ == n
    assert (ctypes.c_char_p, n) not in _placement._ARRAY_TYPES
