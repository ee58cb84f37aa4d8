# The console scripts' entry points, and the signals that come before
# procown can relay them.
#
# `procown run` and `procown timeout` relay SIGINT, SIGTERM, SIGHUP (and
# timeout's SIGQUIT and SIGALRM) once trio's signal receiver is installed.
# Before that come the interpreter's start-up and the imports, 0.15-0.3 s
# (longer on a loaded machine), when the interpreter's own dispositions
# applied: SIGINT raised KeyboardInterrupt inside some import, and procown
# died of it with a Python traceback on stderr; SIGALRM killed procown
# (status 142, where GNU timeout, whose child is already running by then,
# reports a timeout: 124). So an entry point catches those signals first,
# before importing anything else, with a handler that only notes them
# (hold). main() gives them back their dispositions (release) before it runs
# anything, and takes the noted ones: `procown timeout` relays them to the
# command once it runs, as GNU timeout would have (its child starts within
# a millisecond); `procown run` and the other subcommands end at once,
# nothing having been started: 128+N for a signal procown handles (INT,
# TERM, HUP), else by the signal's own disposition, as before. The short
# window from release to trio's receiver is the interpreter's again.

from __future__ import annotations

import signal

TYPE_CHECKING = False  # (typing, ~3 ms cold, is not imported before the signals are held)
if TYPE_CHECKING:
    from typing import Any

# The signals held until main() runs.
EARLY = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM)

_held: dict[int, Any] = {}  # signal -> its disposition before hold()
_noted: list[int] = []  # signals that arrived while held, in order


def _note(signum: int, _frame: object) -> None:
    _noted.append(signum)


def hold(extra: int | None = None) -> None:
    """Note EARLY signals (and `extra`, timeout's -s signal) instead of
    acting on them, until release()."""
    for signum in (*EARLY, *(() if extra is None or extra in EARLY else (extra,))):
        try:
            _held[signum] = signal.signal(signum, _note)
        except (OSError, ValueError):  # not the main thread (nothing is held), or not catchable
            if signum in EARLY:
                break


def timeout_signal(args: list[str]) -> int | None:
    """The signal of GNU timeout's -s/--signal among `args` (its options,
    before the duration), read before the parser is imported: GNU timeout
    relays that signal too once its child runs. None when absent, or in a
    form only the parser reads (a realtime name); never raises."""
    value: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break  # the duration: the options end
        if arg.startswith("--"):
            name, eq, given = arg[2:].partition("=")
            takes = "signal".startswith(name) or "kill-after".startswith(name)
            if takes and not eq:
                i += 1
                given = args[i] if i < len(args) else ""
            if name and "signal".startswith(name):
                value = given
        else:
            for j, letter in enumerate(arg[1:], 1):
                if letter in "sk":
                    rest = arg[j + 1 :]
                    if not rest:
                        i += 1
                        rest = args[i] if i < len(args) else ""
                    if letter == "s":
                        value = rest
                    break
        i += 1
    if not value:
        return None
    if value.isdigit():
        number = int(value)
    else:
        name = value.upper()
        found = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
        if not isinstance(found, int):
            return None
        number = int(found)
    return number if 0 < number < signal.NSIG and number not in (signal.SIGKILL, signal.SIGSTOP) else None


def release() -> list[int]:
    """Give the held signals back their dispositions; return those noted
    meanwhile, each once, in the order they first came."""
    for signum, previous in _held.items():
        signal.signal(signum, previous)
    _held.clear()
    noted = list(dict.fromkeys(_noted))
    _noted.clear()
    return noted


def procown() -> None:
    """The `procown` console script."""
    import sys

    hold(timeout_signal(sys.argv[2:]) if sys.argv[1:2] == ["timeout"] else None)
    from ._cli import entry

    entry()


def procown_timeout() -> None:
    """The `procown-timeout` console script."""
    import sys

    hold(timeout_signal(sys.argv[1:]))
    from ._timeout import entry

    entry()
