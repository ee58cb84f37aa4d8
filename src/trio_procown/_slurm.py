# The Slurm ownership domain: an owned command run as a Slurm job.
#
# Theory of operation. The leader is a local `srun` (in its own session, as
# every leader is); it submits the job, streams the tasks' stdout/stderr
# into our single drain (`--unbuffered`), and exits when the job's step
# ends. The job carries a unique name (procown-<hex>), by which its id is
# found (`squeue -n`), and its own `--time`, derived from the command's
# `timeout` plus the teardown budgets: Slurm ends the job by itself when
# the owner cannot (crashed, SIGKILLed). Slurm counts that limit in whole
# minutes and checks it periodically, so it is a coarse backstop; the
# teardown below is the precise one.
#
# Before anything runs, `srun --test-only` with the same options asks the
# controller whether it would take the job (no job is submitted): no srun
# on PATH, a controller that does not answer, an unknown partition, a
# rejected option all raise DomainUnavailable naming the reason.
#
# Teardown, on the same ladder and budgets as the local domains:
#
#   graceful  `scancel --signal=TERM JOB`, then `--signal=CONT`: every
#             process Slurm tracks in every step of the job. Not `--full`:
#             on a job started by srun it signals nothing (it addresses the
#             batch step, which such a job does not have; measured on 22.05,
#             docs/domains.md). A job still pending is cancelled (`scancel
#             JOB`) and never starts; before the job is even registered,
#             the signals go to srun's process group (srun then gives up).
#   force     `scancel --signal=KILL JOB.STEP` for each step (a SIGKILL
#             to the whole job is a cancel to Slurm, with its own
#             TERM-KillWait-KILL ladder), srun left to see the step end;
#             SIGKILL to srun's process group if no job was ever seen.
#   empty     srun has exited, the job is no longer pending, running or
#             completing (`squeue`), and on this host no process Slurm
#             tracks for it is alive (`scontrol listpids`).
#
# With proctrack/linuxproc Slurm tracks a step's processes by parentage: a
# member whose parent died is re-parented to init and lost (it leaves
# `listpids`, a later SIGKILL misses it, the job hangs in COMPLETING). When
# the node is this host, the census (the environment cookie, which srun
# exports to the tasks) finds such processes, and the teardown ends them as
# escapees. For a node that is not this host, nothing of its processes can
# be seen from here: the receipt says that its only evidence is Slurm's job
# state.
#
# Every Slurm call is a subprocess with a timeout (CALL_TIMEOUT); a failed
# or timed-out call is recorded (read_failures, Sent.failed) and never
# skips a stage or a bound. Calls made from the synchronous domain
# interface (signals, the final evidence) block the loop for their duration
# (milliseconds on a healthy controller, at most CALL_TIMEOUT); the waiting
# itself runs them with trio.run_process.

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import ClassVar

import trio

from . import _clock, _procfs
from ._domain import Domain, Sent, describe_error, killpg_owned, own_group, signal_names
from ._errors import DomainUnavailable
from ._leader import Leader
from ._procfs import ProcessTable, ProcInfo
from ._receipt import signame

# The bound of one Slurm command (squeue, scancel, scontrol, sacct, srun
# --test-only): a healthy controller answers in milliseconds; one that is
# down makes the clients retry for tens of seconds.
CALL_TIMEOUT = 5.0

# How often the wait polls Slurm for the job's state.
POLL_INTERVAL = 0.1

# How long a `scontrol listpids` answer is reused by membership checks
# (the census asks once per process it finds).
LISTPIDS_TTL = 0.25

# Job states in which the job may still hold processes.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)
NOT_STARTED = frozenset({"PENDING", "CONFIGURING", "REQUEUE_HOLD", "RESV_DEL_HOLD"})


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """One Slurm command's answer; `failed` says why it is no evidence."""

    rc: int
    out: str
    err: str
    failed: str = ""


def _answer(argv: Sequence[str], rc: int | None, out: bytes, err: bytes, timeout: float) -> Answer:
    text, why = out.decode(errors="replace"), err.decode(errors="replace").strip()
    if rc is None:
        return Answer(-1, text, why, f"{argv[0].rsplit('/', 1)[-1]} did not answer within {timeout:g}s")
    return Answer(rc, text, why)


def call(argv: Sequence[str], timeout: float | None = None) -> Answer:
    """Run a Slurm command synchronously, bounded by `timeout` (default
    CALL_TIMEOUT)."""
    timeout = CALL_TIMEOUT if timeout is None else timeout
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return _answer(argv, None, exc.stdout or b"", exc.stderr or b"", timeout)
    except OSError as exc:
        return Answer(-1, "", "", f"{argv[0]}: {describe_error(exc)}")
    return _answer(argv, done.returncode, done.stdout, done.stderr, timeout)


async def _kill(process: trio.Process) -> None:
    # Slurm's clients keep retrying through SIGTERM: the bound is the bound.
    process.kill()


async def acall(argv: Sequence[str], timeout: float | None = None) -> Answer:
    """Run a Slurm command from Trio, bounded by `timeout` (default
    CALL_TIMEOUT; the process is killed and reaped when it expires)."""
    timeout = CALL_TIMEOUT if timeout is None else timeout
    with _clock.after(timeout):
        try:
            done = await trio.run_process(
                list(argv), capture_stdout=True, capture_stderr=True, check=False, deliver_cancel=_kill
            )
        except OSError as exc:
            return Answer(-1, "", "", f"{argv[0]}: {describe_error(exc)}")
        return _answer(argv, done.returncode, done.stdout, done.stderr, timeout)
    return _answer(argv, None, b"", b"", timeout)


def _last_line(text: str) -> str:
    """The last line that says something: srun ends an option's error with
    a pointer to its help, after the line that names the option."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith('Try "srun --help"')]
    return (said or lines or [""])[-1]


def limit_minutes(seconds: float) -> int:
    """A time limit in Slurm's unit: whole minutes, rounded up, at least 1."""
    return max(1, math.ceil(seconds / 60))


def _scancel_name(sig: int) -> str:
    """How scancel --signal takes `sig`: its name, or its number (realtime)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


@dataclasses.dataclass(frozen=True, slots=True)
class SlurmDomain:
    """Run the owned command as a Slurm job (`srun`), owned like a local one.

    `partition`: the partition to submit to (the cluster's default if None).
    `time_limit`: an upper bound, in seconds, on the job's `--time`; the job
    otherwise gets its command's `timeout` plus the teardown budgets, rounded
    up to whole minutes (none without a timeout: the partition's limit).
    `extra_args`: more srun options, e.g. ``("--mem=1G",)``.

    Synopsis::

        domain = trio_procown.SlurmDomain(partition="debug", time_limit=3600)
        print(domain.limit_seconds)   # 3600; open_owned_command adds the deadline
        # result = await trio_procown.run_owned(["hostname"], timeout=60, domain=domain)
        # result.receipt.domain_id == "slurm job 42"
    """

    partition: str | None = None
    time_limit: float | None = None
    extra_args: Sequence[str] = ()
    # Set by open_owned_command: timeout + grace + kill_wait + drain_wait.
    deadline: float | None = dataclasses.field(default=None, repr=False)
    checked: bool = dataclasses.field(default=False, repr=False)

    name: ClassVar[str] = "slurm"

    def __post_init__(self) -> None:
        if isinstance(self.extra_args, (str, bytes)):  # (a str is a sequence of characters)
            msg = f"extra_args must be a sequence of options, not one string: {self.extra_args!r}"
            raise TypeError(msg)
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if self.partition is not None and not isinstance(self.partition, str):
            msg = f"partition must be a str or None, not {self.partition!r}"
            raise TypeError(msg)
        limit = self.time_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
            msg = f"time_limit must be a number of seconds or None, not {limit!r}"
            raise TypeError(msg)
        if limit is not None and (math.isnan(limit) or limit <= 0 or math.isinf(limit)):
            msg = f"time_limit must be a finite, positive number of seconds, not {limit!r}"
            raise ValueError(msg)
        if not all(isinstance(a, str) for a in self.extra_args):
            msg = f"extra_args must be strings, not {self.extra_args!r}"
            raise TypeError(msg)

    @property
    def limit_seconds(self) -> float | None:
        """The seconds the job's --time must cover (before rounding), or None."""
        bounds = [b for b in (self.time_limit, self.deadline) if b is not None]
        return min(bounds) if bounds else None

    def srun_options(self, job_name: str) -> list[str]:
        """srun's options for a job named `job_name`."""
        options = [f"--job-name={job_name}", "--quiet", "--unbuffered", "--ntasks=1"]
        if self.partition is not None:
            options.append(f"--partition={self.partition}")
        limit = self.limit_seconds
        if limit is not None:
            options.append(f"--time={limit_minutes(limit)}")
        options.extend(self.extra_args)
        return options

    def bound(self, timeout: float | None, budgets: float) -> SlurmDomain:
        """This spec with the job's deadline: timeout plus the teardown budgets."""
        deadline = None if timeout is None or math.isinf(timeout) else timeout + budgets
        return dataclasses.replace(self, deadline=deadline)

    def _check_answer(self, answer: Answer) -> None:
        if answer.failed:
            msg = f"the Slurm controller did not answer (srun --test-only): {answer.failed}"
            raise DomainUnavailable(msg)
        if answer.rc != 0:
            why = _last_line(answer.err) or _last_line(answer.out) or f"exit status {answer.rc}"
            msg = f"Slurm would not take the job (srun --test-only): {why}"
            raise DomainUnavailable(msg)

    def _test_argv(self, argv: Sequence[str]) -> list[str]:
        return [srun_path(), "--test-only", *self.srun_options("procown-check"), "--", *argv]

    async def checked_for(self, argv: Sequence[str]) -> SlurmDomain:
        """Ask the controller whether it would take the job, without
        submitting it (async, bounded); raise DomainUnavailable if not."""
        self._check_answer(await acall(self._test_argv(argv)))
        return dataclasses.replace(self, checked=True)

    def check(self, argv: Sequence[str]) -> None:
        """As checked_for(), synchronously."""
        self._check_answer(call(self._test_argv(argv)))

    def make(self) -> SlurmJobDomain:
        """A fresh domain for one command."""
        return SlurmJobDomain(self)


def srun_path() -> str:
    """srun's path; DomainUnavailable when Slurm's clients are not installed."""
    found = shutil.which("srun")
    if found is None:
        msg = "Slurm is not installed here: srun was not found on PATH"
        raise DomainUnavailable(msg)
    return found


def this_host() -> str:
    return socket.gethostname().split(".", 1)[0]


def cluster_status(timeout: float | None = None) -> tuple[bool, str]:
    """Whether a Slurm cluster is reachable from here, and what it offers
    (for `procown doctor` and the tests' skip reason)."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return False, "Slurm's clients are not installed (no srun/sinfo on PATH)"
    answer = call(["sinfo", "-h", "-o", "%P %a %D %t %l"], timeout)
    if answer.failed:
        return False, f"no answer from the Slurm controller: {answer.failed}"
    if answer.rc != 0:
        return False, f"sinfo failed: {_last_line(answer.err) or answer.rc}"
    parts = []
    usable = False
    for line in answer.out.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        partition, avail, nodes, state, limit = fields[:5]
        parts.append(f"{partition} ({avail}, {nodes} node(s) {state}, limit {limit})")
        usable = usable or (avail == "up" and state in ("idle", "mix", "alloc", "comp"))
    if not parts:
        return False, "the controller answered but lists no partition"
    offers = "partitions " + ", ".join(parts)
    return usable, offers if usable else f"no partition has a usable node: {offers}"


class _Fired:
    """A Slurm command started without waiting for it (a signal request)."""

    __slots__ = ("deadline", "popen", "what")

    def __init__(self, popen: subprocess.Popen[bytes], what: str, deadline: float) -> None:
        self.popen = popen
        self.what = what
        self.deadline = deadline


# Answers of scancel that are no failure: the job was already over, or not
# (yet, or any more) in the state the request addressed.
BENIGN = ("already completing or completed", "Invalid job id", "can not be altered now", "not found")


class SlurmJobDomain(Domain):
    """One owned command's Slurm job (made by SlurmDomain.make())."""

    kind = "slurm"

    def __init__(self, spec: SlurmDomain) -> None:
        super().__init__()
        self.spec = spec
        self.job_name = f"procown-{os.urandom(6).hex()}"
        self.job_id = ""
        self.nodes = ""
        self.state: str | None = None  # the last state seen (None: not listed)
        self._state_at = -math.inf
        self.pgid = 0
        self.host = this_host()
        self._failures: list[str] = []
        self._listpids: tuple[float, frozenset[int]] = (-math.inf, frozenset())
        self._fired: list[_Fired] = []
        self._evidence = ""  # Slurm's final word, fetched when the job was seen ended
        self._notes: list[str] = []

    # -- lifecycle ----------------------------------------------------------
    def prepare(self, argv: Sequence[str]) -> list[str]:
        srun = srun_path()
        if not self.spec.checked:
            self.spec.check(argv)
        return [srun, *self.spec.srun_options(self.job_name), "--", *argv]

    def attach(self, leader: Leader, started: float) -> None:
        super().attach(leader, started)
        self.pgid = own_group(leader)

    @property
    def ident(self) -> str:
        if self.job_id:
            return f"slurm job {self.job_id}"
        return f"slurm job named {self.job_name} (no job id seen)"

    @property
    def local(self) -> bool:
        """Does the job run on this host (so its processes can be seen)?"""
        return not self.nodes or self.nodes == self.host

    # -- Slurm's evidence ---------------------------------------------------
    def _note(self, answer: Answer, what: str) -> Answer:
        if answer.failed:
            self._failures.append(f"{what}: {answer.failed}")
        return answer

    def _squeue_argv(self) -> list[str]:
        which = ["-j", self.job_id] if self.job_id else ["-n", self.job_name]
        # --states=all: a job that ended is still listed (for MinJobAge).
        return ["squeue", "-h", "--states=all", *which, "-o", "%i|%T|%N"]

    def _take_squeue(self, answer: Answer) -> str | None:
        """The job's state from squeue's answer: None when the job is not
        listed (never submitted, or ended and purged), "?" when unknown."""
        if answer.failed:
            return "?"
        if answer.rc != 0:
            if "Invalid job id" in answer.err:
                return self._seen(None)
            self._failures.append(f"squeue: {_last_line(answer.err) or answer.rc}")
            return "?"
        for line in answer.out.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 3 and fields[0]:
                self.job_id = self.job_id or fields[0]
                if fields[2] and not fields[2].startswith("("):
                    self.nodes = fields[2]
                return self._seen(fields[1])
        return self._seen(None)

    def _seen(self, state: str | None) -> str | None:
        self.state = state
        self._state_at = time.monotonic()
        return state

    def job_state(self, max_age: float = 0.0) -> str | None:
        """The job's state (squeue), see _take_squeue; a state seen less
        than `max_age` seconds ago is reused instead of asking again."""
        if time.monotonic() - self._state_at < max_age:
            return self.state
        return self._take_squeue(self._note(call(self._squeue_argv()), "squeue"))

    async def ajob_state(self) -> str | None:
        return self._take_squeue(self._note(await acall(self._squeue_argv()), "squeue"))

    def _take_listpids(self, answer: Answer) -> frozenset[int]:
        pids = set()
        if answer.rc == 0:
            for line in answer.out.splitlines()[1:]:
                first = line.split(maxsplit=1)[:1]
                if first and first[0].isdigit():
                    pids.add(int(first[0]))
        found = frozenset(pids)
        self._listpids = (time.monotonic(), found)
        return found

    def _listpids_argv(self) -> list[str]:
        return ["scontrol", "listpids", self.job_id]

    def tracked(self) -> frozenset[int]:
        """The pids Slurm tracks for the job on this host (scontrol listpids;
        an answer younger than LISTPIDS_TTL is reused). The job's id is
        looked up first if it is not known yet (once it is, never again)."""
        if not self.job_id:
            self.job_state(max_age=LISTPIDS_TTL)
        if not self.job_id or not self.local:
            return frozenset()
        at, pids = self._listpids
        if time.monotonic() - at < LISTPIDS_TTL:
            return pids
        return self._take_listpids(self._note(call(self._listpids_argv()), "scontrol listpids"))

    async def atracked(self) -> frozenset[int]:
        if not self.job_id or not self.local:
            return frozenset()
        return self._take_listpids(self._note(await acall(self._listpids_argv()), "scontrol listpids"))

    # -- membership -----------------------------------------------------------
    def members(self, snap: list[ProcInfo] | None = None) -> list[ProcInfo]:
        leader_pid = self.leader.pid if self.leader else None
        if snap is None:
            snap = _procfs.snapshot(self.leader.mark if self.leader else None)
        tracked = self.tracked()
        found = [m for m in snap if m.pid != leader_pid and (m.pgrp == self.pgid or m.pid in tracked)]
        self.seen.update((m.pid, m.start) for m in found)
        return found

    def contains(self, pid: int) -> bool:
        if self.leader is not None and pid == self.leader.pid:
            return True
        info = _procfs.read_stat(pid)
        return info is not None and (info.pgrp == self.pgid or pid in self.tracked())

    def pgid_inside(self) -> int:
        return self.pgid

    # -- teardown -------------------------------------------------------------
    def _fire(self, argv: Sequence[str], what: str) -> str:
        """Start a Slurm command without waiting for it (it is collected,
        and its failure recorded, later); "" or why it could not start."""
        self._collect()
        try:
            popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except OSError as exc:
            why = f"{what}: {describe_error(exc)}"
            self._failures.append(why)
            return why
        self._fired.append(_Fired(popen, what, time.monotonic() + CALL_TIMEOUT))
        return ""

    def _collect(self, wait: bool = False) -> None:
        """Record what the fired Slurm commands answered; kill one past its
        bound. With `wait`, wait for each (within its bound)."""
        still = []
        for fired in self._fired:
            popen = fired.popen
            if wait and popen.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(max(0.0, fired.deadline - time.monotonic()))
            if popen.poll() is None:
                if time.monotonic() < fired.deadline:
                    still.append(fired)
                    continue
                popen.kill()
                popen.wait()
                self._failures.append(f"{fired.what}: did not answer within {CALL_TIMEOUT:g}s")
            assert popen.stderr is not None
            err = popen.stderr.read().decode(errors="replace")
            popen.stderr.close()
            if popen.returncode not in (0, -signal.SIGKILL) and not any(b in err for b in BENIGN):
                self._failures.append(f"{fired.what}: {_last_line(err) or f'exit status {popen.returncode}'}")
        self._fired = still

    def _signal_srun(self, sigs: tuple[int, ...], failed: list[str]) -> bool:
        if self.leader is None or self.leader.reaped:
            return False
        sent = False
        for sig in sigs:
            try:
                sent = killpg_owned(self.pgid, sig) or sent
            except OSError as exc:
                failed.append(f"{signame(sig)} to srun: {describe_error(exc)}")
        return sent

    def _by_name(self) -> str:
        return f"--name={self.job_name}"

    def signal_graceful(self, sigs: tuple[int, ...] = (signal.SIGTERM, signal.SIGCONT)) -> Sent:
        # Requests by job name, fired without waiting: the id need not be
        # known, and twenty teardowns never queue behind each other's Slurm
        # calls. A job still pending is cancelled; one running gets the
        # signals in order (one shell runs the scancels one after another).
        names = signal_names(sigs)
        if not self.job_id:
            self.job_state(max_age=LISTPIDS_TTL)  # one lookup: the id names the job in the receipt
        failed = [self._fire(["scancel", "--quiet", self._by_name(), "--state=PENDING"], "scancel (pending)")]
        if sigs:
            script = "; ".join(f'scancel --signal={_scancel_name(s)} --name="$1"' for s in sigs)
            argv = ["/bin/sh", "-c", script, "sh", self.job_name]
            failed.append(self._fire(argv, f"scancel --signal={names}"))
        job = f"slurm job {self.job_id}" if self.job_id else f"the slurm job named {self.job_name}"
        if self.state in NOT_STARTED:
            detail = f"{job} cancelled while {self.state}, before it started (scancel)"
        else:
            detail = f"{names} to every step of {job} (scancel --signal; cancelled instead if still pending)"
        return Sent(detail, "; ".join(f for f in failed if f))

    def force(self) -> Sent:
        # SIGKILL to the steps' processes, and srun left alive to see them
        # end: the step then completes at once. Addressed to each step
        # (JOB.STEP), not to the job: Slurm takes a SIGKILL for a whole job
        # as a cancel and runs its own ladder (SIGTERM, KillWait, SIGKILL),
        # so a task that ignores SIGTERM outlived kill_wait by KillWait
        # (measured: 5.7 s with KillWait=2, every run; a step's SIGKILL
        # ended it within 0.1 s). Cancelling the job (or killing srun)
        # costs the same ladder before the job leaves COMPLETING. srun is
        # killed when no job of ours was ever seen registered (srun still
        # asking, or stuck); a job still listed at the release is cancelled
        # there. Before the job's id is known, the job by its name.
        pending = self._fire(["scancel", "--quiet", self._by_name(), "--state=PENDING"], "scancel (pending)")
        if not self.job_id:
            self.job_state(max_age=LISTPIDS_TTL)  # one lookup: the id addresses the steps
        if self.job_id:
            script = (
                'for step in $(squeue --noheader --steps --jobs="$1" --format=%i); '
                'do scancel --quiet --signal=KILL "$step"; done'
            )
            argv = ["/bin/sh", "-c", script, "sh", self.job_id]
            kill = self._fire(argv, "scancel --signal=KILL (each step)")
            how = "scancel --signal=KILL to each step; cancelled instead if still pending"
        else:
            by_name = ["scancel", "--quiet", "--signal=KILL", self._by_name()]
            kill = self._fire(by_name, "scancel --signal=KILL")
            how = "scancel --signal=KILL to the job, by its name; cancelled instead if still pending"
        failed = [pending, kill]
        job = f"slurm job {self.job_id}" if self.job_id else f"the slurm job named {self.job_name}"
        parts = [f"SIGKILL to every step of {job} ({how})"]
        if not self.job_id and self._signal_srun((signal.SIGKILL,), failed):
            parts.append(f"SIGKILL to srun's process group {self.pgid} (no job was seen registered)")
        return Sent("; ".join(parts), "; ".join(f for f in failed if f))

    def _ended(self, state: str | None) -> bool:
        return state is None or (state != "?" and state not in ACTIVE_STATES)

    # srun exits when the job's step ends, and Slurm lists the job as
    # COMPLETING for a moment after (its epilog, the step's cleanup): seen
    # in 1 of 3 quick jobs here, whose receipts then said the domain was not
    # proven empty though nothing of it was left.
    settles = True

    async def settle(self, within: float) -> None:
        if not self.job_id:
            return
        with _clock.after(within):
            while not self._ended(await self.ajob_state()):
                await _clock.sleep(POLL_INTERVAL)

    def is_empty(self, snap: list[ProcInfo] | None = None) -> bool:
        assert self.leader is not None
        if self.leader.alive or self.live_members(snap):
            return False
        return self._ended(self.job_state(max_age=LISTPIDS_TTL))

    async def wait_empty(self, hint: list[ProcInfo] | None = None) -> ProcessTable | None:
        assert self.leader is not None
        if not self.job_id:
            await self.ajob_state()  # learn the id (and node) for the stages after this one
        while True:
            # srun exits when the step ends; the job may still be listed as
            # completing for a moment after.
            with _clock.after(POLL_INTERVAL * 5):
                await self.leader.wait()
            self._collect()
            if self.leader.alive:
                continue
            state = await self.ajob_state()
            if self._ended(state):
                await self.atracked()  # refresh for the scan below
                table = await _procfs.table_for(self.leader.mark)
                if not self.live_members(table.rows):
                    if not self._evidence:
                        self._evidence = await self._afinal_word()
                    return table
            await _clock.sleep(POLL_INTERVAL)

    # -- receipt evidence -----------------------------------------------------
    def read_failures(self) -> list[str]:
        self._collect()
        return list(dict.fromkeys(self._failures))

    def verify(self) -> str:
        # From what was already seen: no Slurm call at the start of a teardown.
        if self.nodes and not self.local:
            return (
                f"slurm job {self.job_id} ran on node {self.nodes}, not this host ({self.host}): its "
                "processes could not be seen from here; Slurm's job state is the only evidence of them"
            )
        return ""

    @property
    def escape_evidence(self) -> str:
        if self.local:
            return "census"
        return f"Slurm's job state only (node {self.nodes} is not this host)"

    def _show_argv(self) -> list[str]:
        return ["scontrol", "-o", "show", "job", self.job_id]

    def _sacct_argv(self) -> list[str]:
        return ["sacct", "-n", "-P", "-X", "-j", self.job_id, "-o", "State,ExitCode"]

    async def _afinal_word(self) -> str:
        if not self.job_id:
            return ""
        shown = self._note(await acall(self._show_argv()), "scontrol show job")
        acct = self._note(await acall(self._sacct_argv()), "sacct")
        return self._final_word(shown, acct)

    def _final_word(self, shown: Answer, acct: Answer) -> str:
        fields: dict[str, str] = {}
        for token in shown.out.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        state = fields.get("JobState", "")
        nodes = fields.get("NodeList", "") or self.nodes or "(none)"
        if nodes not in ("(null)", "(none)"):
            self.nodes = nodes
        if state:
            said = (
                f"slurm job {self.job_id} on node(s) {nodes}: JobState={state}, "
                f"ExitCode={fields.get('ExitCode', '?')}, Reason={fields.get('Reason', '?')} (scontrol)"
            )
        else:
            why = shown.failed or _last_line(shown.err) or "no answer"
            said = f"slurm job {self.job_id}: scontrol has no record ({why})"
        if state == "CANCELLED" and fields.get("RunTime") in ("00:00:00", "0:00"):
            said += "; it never started"
        if acct.failed or acct.rc != 0 or not acct.out.strip():
            why = acct.failed or _last_line(acct.err) or "no record"
            said += f"; accounting: not proven ({why})"
        else:
            said += f"; accounting (sacct): {_last_line(acct.out)}"
        if state in ACTIVE_STATES:
            said += f"; the job is still {state}: NOT removed from the cluster"
        return said

    def release(self) -> str:
        """Slurm's final word on the job, as evidence for the receipt; a
        job still listed is cancelled first, so nothing is left queued."""
        self._collect(wait=True)
        if self._evidence:
            return self._evidence  # fetched when the job was seen ended
        state = self.job_state(max_age=LISTPIDS_TTL)
        if not self.job_id:
            return f"no Slurm job named {self.job_name} was seen (never registered, or purged)"
        cancelled = ""
        if state in ACTIVE_STATES and state != "COMPLETING":
            answer = self._note(call(["scancel", "--quiet", self.job_id]), "scancel")
            cancelled = f"it was still {state} at the release and was cancelled (scancel)"
            if answer.failed or answer.rc != 0:
                cancelled += f", which failed: {answer.failed or _last_line(answer.err)}"
        said = self._final_word(
            self._note(call(self._show_argv()), "scontrol show job"),
            self._note(call(self._sacct_argv()), "sacct"),
        )
        return f"{said}; {cancelled}" if cancelled else said
