# Owned commands in the background of a trio run: the object behind the
# pytest plugin's `procown_command` fixture, usable from any trio code.
#
# Each command is run by open_owned_command in a trio *system task*, so it is
# owned by the trio run rather than by the caller's nursery: a test can start
# a server, return to its body, and the command is torn down (bounded, with a
# receipt) when the run ends, or earlier by `stop`. A system task must end
# with nothing but Cancelled, so a failure to start is handed back to the
# caller that asked, and any other failure is kept for `errors()`.

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Unpack

import trio

from ._command import Command, OwnedCommand, OwnedOptions, OwnedResult, open_owned_command, run_owned
from ._receipt import Receipt
from ._spawn import normalize_command


@dataclass(eq=False)
class _Entry:
    command: Command
    options: OwnedOptions
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    run: OwnedCommand | None = None
    error: BaseException | None = None


class OwnedCommands:
    """The `procown_command` fixture: owned commands started by one test.

    ``await procown_command(cmd, **options)`` starts `cmd` with
    `open_owned_command` in the background and returns the running
    OwnedCommand; it is torn down (bounded, with a receipt) when the test's
    trio run ends, or earlier with ``await procown_command.stop(run)``.
    ``await procown_command.run(cmd, **options)`` runs one to completion
    (`run_owned`). Receipts are kept in `.receipts` and attached to the test
    report when the test fails.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.receipts: list[tuple[Command, Receipt]] = []
        self._entries: list[_Entry] = []

    async def __call__(self, command: Command, **options: Unpack[OwnedOptions]) -> OwnedCommand:
        entry = _Entry(normalize_command(command), options)
        self._entries.append(entry)
        trio.lowlevel.spawn_system_task(self._run_in_background, entry, name=f"procown_command {command!r}")
        await entry.started.wait()
        if entry.run is None:
            assert entry.error is not None
            raise entry.error
        return entry.run

    async def run(self, command: Command, **options: Unpack[OwnedOptions]) -> OwnedResult:
        """Run `command` to completion (run_owned), recording its receipt."""
        command = normalize_command(command)
        result = await run_owned(command, **options)
        self.receipts.append((command, result.receipt))
        return result

    async def stop(self, run: OwnedCommand) -> Receipt:
        """Tear down a command started by this fixture now; its receipt."""
        for entry in self._entries:
            if entry.run is run:
                entry.scope.cancel()
                await entry.done.wait()
                assert run.receipt is not None
                return run.receipt
        msg = "this command was not started by this procown_command fixture"
        raise ValueError(msg)

    async def _run_in_background(self, entry: _Entry) -> None:
        # A system task: it must end with nothing but Cancelled.
        try:
            with entry.scope:
                async with open_owned_command(entry.command, **entry.options) as run:
                    entry.run = run
                    entry.started.set()
                    await run.wait()
        except trio.Cancelled:
            raise
        except BaseException as exc:
            entry.error = exc
        finally:
            if entry.run is not None and entry.run.receipt is not None:
                self.receipts.append((entry.command, entry.run.receipt))
            entry.started.set()
            entry.done.set()

    def check_finished(self) -> None:
        """Raise if a command is still running (its trio run outlived the
        caller?) or failed after it had started (spawn errors were raised at
        once)."""
        unfinished = [e.command for e in self._entries if not e.done.is_set()]
        if unfinished:
            msg = (
                f"procown_command: {len(unfinished)} command(s) still running at teardown "
                f"(their trio run outlived the test?): {unfinished!r}"
            )
            raise RuntimeError(msg)
        for entry in self._entries:
            if entry.error is not None and entry.run is not None:
                raise entry.error

    def report(self) -> str:
        """Every receipt, as `$ command` and its summary."""
        parts = []
        for command, receipt in self.receipts:
            argv = normalize_command(command)
            shown = argv if isinstance(argv, str) else " ".join(argv)
            parts.append(f"$ {shown}\n{receipt.summary()}")
        return "\n\n".join(parts)
