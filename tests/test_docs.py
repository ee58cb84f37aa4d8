"""The examples of the README, docs/*.md and the docstrings run as written,
and the sample receipts and transcripts they show are what the code prints.

Collected, one test per example, named FILE:LINE (the example's first line):

- every fenced ``python`` block of README.md and docs/*.md;
- every ``Synopsis::`` block of src/trio_procown/*.py;
- every ``text`` block of README.md and docs/*.md marked as a transcript.

Markdown blocks take a directive from an HTML comment on the line before
their fence (invisible on GitHub and in the built pages)::

    <!-- doctest: skip (REASON) -->        a deliberate fragment: not run
    <!-- doctest: output -->               on a text block: what the python block
                                           before it prints (compared, see below)
    <!-- doctest: transcript -->           on a text block of `$ COMMAND` lines and
                                           their output: each command is run
    <!-- doctest: pytest-args ARGS; exit N -->   for a test module: how pytest is
                                           run, and the status it must end with

Each example runs in a fresh interpreter (``python -c`` with a small runner),
in a temporary directory, as an owned command (``run_owned``, 30 s timeout),
and must exit 0 and leave no process behind. The example's text is run
unchanged: a block with top-level ``await`` (or ``async with``/``async for``)
runs as in ``python -m trio``, i.e. wrapped in an ``async def`` run by
``trio.run``; tracebacks name the file and line the example is at.

A block that defines ``test_*`` functions is a pytest test module: it is
written to a file and run with ``python -m pytest``. A block whose first line
is ``# NAME.py`` or ``# NAME.toml`` is a file of its page's example project
(a conftest, a pyproject.toml): it is written next to that page's test
modules when they run.

Markdown blocks must be self-contained (their own imports). Synopsis blocks
are fragments of API documentation: the names they use without defining
them (``run``, ``receipt``, ``owner``, ``cmd``, the package's modules) are
set up by the explicit preludes in ``PRELUDES`` below, run before the
example in the same namespace.

Shown output is compared line by line after normalising what varies between
runs (pids, times, cgroup paths); a line ``...`` (or ``- ...``) stands for any
number of lines. A few lines whose presence varies between runs or machines
(``UNSTABLE``: a zombie claim that depends on a race, doctor's note on the
cgroup2 mount) are ignored when only one side has them. Samples that show
the cgroup domain are checked only where this machine offers it.

Test modules run with plugin autoloading off and the plugins they are
written for loaded explicitly (``PYTEST_PLUGINS``), which saves ~1.5 s each.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import json
import os
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import trio_procown

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SRC_FILES = sorted((ROOT / "src" / "trio_procown").glob("*.py"))
TIMEOUT = 30.0  # per example; a hung example is torn down and fails

# -- preludes for Synopsis blocks ------------------------------------------------
#
# name -> (names it needs first, code). The code runs before the example in
# the same namespace; `_stack` is a contextlib.AsyncExitStack that the runner
# closes after the example (so an owner or command opened here is left, like
# the block the example stands in, after the example ran). Order matters: an
# owner is entered before a command, so the command's block is left first.
PRELUDES: dict[str, tuple[tuple[str, ...], str]] = {
    "trio": ((), "import trio"),
    "trio_procown": ((), "import trio_procown"),
    "sys": ((), "import sys"),
    "subprocess": ((), "import subprocess"),
    "log": ((), "import logging\nlog = logging.getLogger('example')"),
    "no_leaks": ((), "from trio_procown.pytest_plugin import no_leaks"),
    "Budgets": ((), "from trio_procown._escalation import Budgets"),
    "Escalation": ((), "from trio_procown._escalation import Escalation"),
    "Event": ((), "from trio_procown._escalation import Event"),
    # A short command that prints what the readiness examples look for, then exits.
    "cmd": ((), 'cmd = ["sh", "-c", "echo listening on port 8000; echo ready; echo up; sleep 0.2"]'),
    # A receipt with a timeline: a shell and its background child, timed out.
    "receipt": (
        ("trio_procown",),
        'receipt = (await trio_procown.run_owned("sleep 30 & echo early; sleep 30", timeout=0.2)).receipt',
    ),
    "owner": (
        ("trio_procown",),
        'owner = await _stack.enter_async_context(trio_procown.open_service_owner("docs"))',
    ),
    "web": (("owner",), 'web = await owner.start(["sleep", "30"])'),
    # A running command whose stderr ended after one line (so that reading
    # it ends), in that state for every example. Leaving it ends it (the
    # block it stands in would wait for it), unless it was handed off.
    "run": (
        ("trio_procown",),
        textwrap.dedent(
            """\
            run = await _stack.enter_async_context(trio_procown.open_owned_command(
                ["sh", "-c", "echo 'warning: disk almost full' >&2; exec 2>&-; echo ready; sleep 30"]))
            async for _ in run.stream("stderr"):
                pass
            async def _end_run():
                if run.handoff is None:
                    await run.terminate()
            _stack.push_async_callback(_end_run)
            """
        ),
    ),
}

# pytest configuration for Synopsis test modules: they are written for trio
# tests (pytest-trio), as the docstrings say.
SYNOPSIS_PYTEST_CONFIG = "[tool.pytest.ini_options]\ntrio_mode = true\n"

# Test modules run with the plugins they are written for, loaded explicitly
# (autoloading every installed plugin costs ~1.5 s per run here).
PYTEST_PLUGINS = ["-p", "trio_procown.pytest_plugin", "-p", "pytest_trio.plugin"]

# Synopsis examples on the `run` prelude that fail on an open bug of the
# library, each pinned by a strict xfail (remove it with the fix):
# (text in the example, reason).
KNOWN_BUGS: list[tuple[str, str]] = []

# -- collection --------------------------------------------------------------------

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doctest:\s*(?P<text>.*?)\s*-->\s*$")
FILE_HEADER = re.compile(r"^#\s*(?P<name>[\w.-]+\.(?:py|toml|ini|cfg))\s*$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the first line of code
    lang: str
    code: str
    directive: str = ""
    synopsis: bool = False
    output: Block | None = None  # the shown output of this python block
    project: list[Block] = field(default_factory=list)  # the page's files

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def filename(self) -> str | None:
        first = self.code.splitlines()[0] if self.code.strip() else ""
        match = FILE_HEADER.match(first)
        return match.group("name") if match else None

    def option(self, name: str) -> str | None:
        for part in self.directive.split(";"):
            word, _, rest = part.strip().partition(" ")
            if word == name:
                return rest.strip()
        return None


def markdown_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.group("fence"), match.group("info").strip()
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        directive = DIRECTIVE.match(previous)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j])
            j += 1
        code = textwrap.dedent("\n".join(body)) + "\n"
        lang = info.split()[0] if info else ""
        blocks.append(Block(path, i + 2, lang, code, directive.group("text") if directive else ""))
        i = j + 1
    return blocks


def synopsis_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    for i, line in enumerate(lines):
        if line.strip() != "Synopsis::":
            continue
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            text = lines[j]
            if text.strip() and (len(text) - len(text.lstrip()) <= indent or text.strip() == '"""'):
                break
            body.append(text)
            j += 1
        first = next(k for k, text in enumerate(body) if text.strip())
        code = textwrap.dedent("\n".join(body[first:])).strip("\n") + "\n"
        blocks.append(Block(path, i + 2 + first, "python", code, synopsis=True))
    return blocks


def collect() -> tuple[list[Block], list[Block]]:
    """(python examples, transcripts)"""
    examples: list[Block] = []
    transcripts: list[Block] = []
    for path in DOC_FILES:
        blocks = markdown_blocks(path)
        project = [b for b in blocks if b.filename and b.lang in ("python", "toml")]
        last_python: Block | None = None
        for block in blocks:
            if block.lang == "python":
                block.project = project
                last_python = block
                if block.filename is None or block.filename.startswith("test_"):
                    examples.append(block)
            elif block.option("output") is not None:
                assert last_python is not None, f"{block.id}: output of no python block"
                last_python.output = block
            elif block.option("transcript") is not None:
                transcripts.append(block)
    for path in SRC_FILES:
        examples.extend(synopsis_blocks(path))
    return examples, transcripts


EXAMPLES, TRANSCRIPTS = collect()


def is_test_module(code: str) -> bool:
    tree = ast.parse(code)
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
        for node in tree.body
    )


def free_names(code: str) -> set[str]:
    """Names the code reads but never binds (nor are builtins)."""
    tree = ast.parse(code)
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - set(dir(builtins))


def preludes_for(code: str) -> list[str]:
    """The preludes an example needs, with their dependencies, in PRELUDES order."""
    wanted: set[str] = set()

    def want(name: str) -> None:
        if name in PRELUDES and name not in wanted:
            wanted.add(name)
            for dep in PRELUDES[name][0]:
                want(dep)

    for name in free_names(code):
        want(name)
    return [name for name in PRELUDES if name in wanted]


# The runner: compiles each source with top-level await allowed; if any is a
# coroutine, all run in one trio.run inside an AsyncExitStack (`_stack`).
RUNNER = """\
import ast, contextlib, inspect
SOURCES = {sources!r}

def compiled(filename, first_line, source):
    # Padded so that a traceback gives the line in the file the example is in.
    padded = "\\n" * (first_line - 1) + source
    return compile(padded, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

codes = [compiled(*source) for source in SOURCES]
namespace = {{"__name__": "__main__"}}

def is_async(code):
    return bool(code.co_flags & inspect.CO_COROUTINE)

if not any(is_async(code) for code in codes):
    for code in codes:
        exec(code, namespace)
else:
    import trio

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            namespace["_stack"] = stack
            for code in codes:
                result = eval(code, namespace)
                if is_async(code):
                    await result

    trio.run(main)
"""


async def run_command(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run argv owned (bounded by TIMEOUT); (status, stdout and stderr merged).
    Fails if the command timed out or left processes behind."""
    result = await trio_procown.run_owned(
        argv, cwd=cwd, timeout=TIMEOUT, stderr="stdout", env=env or example_env(), grace=1.0
    )
    text = result.stdout.decode(errors="replace")
    receipt = result.receipt
    assert receipt.cause == "exited", f"{shlex.join(argv)}: {receipt.summary()}\n{text}"
    left = [*receipt.leftovers, *receipt.census]
    assert not left, f"the example left processes running:\n{receipt.summary()}\n{text}"
    assert result.returncode is not None
    return result.returncode, text


def example_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # output of prints and of commands in the order written
    env.pop("PYTEST_ADDOPTS", None)
    return env


def write_project(block: Block, where: Path) -> None:
    for part in block.project:
        if part is not block and part.filename and not part.filename.startswith("test_"):
            (where / part.filename).write_text(part.code, encoding="utf-8")


async def run_example(block: Block, tmp_path: Path) -> str:
    env = example_env()
    if is_test_module(block.code):
        prelude = (
            "".join(PRELUDES[name][1] + "\n" for name in preludes_for(block.code)) if block.synopsis else ""
        )
        if block.synopsis:
            (tmp_path / "pyproject.toml").write_text(SYNOPSIS_PYTEST_CONFIG, encoding="utf-8")
        else:
            write_project(block, tmp_path)
        module = block.filename or "test_example.py"
        (tmp_path / module).write_text(prelude + block.code, encoding="utf-8")
        pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PYTEST_PLUGINS]
        argv = [*pytest_argv, *shlex.split(block.option("pytest-args") or ""), module]
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # see PYTEST_PLUGINS
    else:
        sources = []
        if block.synopsis:
            for name in preludes_for(block.code):
                sources.append((f"<prelude {name}>", 1, PRELUDES[name][1]))
        sources.append((str(block.path.relative_to(ROOT)), block.line, block.code))
        argv = [sys.executable, "-c", RUNNER.format(sources=sources)]
    status, text = await run_command(argv, tmp_path, env)
    expected = int(block.option("exit") or 0)
    assert status == expected, f"{block.id} exited with {status} (expected {expected}):\n{text}"
    return text


# -- comparing shown output ----------------------------------------------------------

NORMALISE = [
    # Any cgroup path (examples run nested in a cgroup of this test's own).
    (re.compile(r"/sys/fs/cgroup[^\s),]*?(?=[.,]?(?:[\s)]|$))"), "CGROUP"),
    (re.compile(r"\b(pid|pgid|process group) \d+"), r"\1 N"),
    (re.compile(r"\+\d+\.\d+s\b"), "+Ts"),
    (re.compile(r"duration=\d+\.\d+s"), "duration=Ts"),
    (re.compile(r"lived \d+(\.\d+)? s\b"), "lived T s"),
    (re.compile(r"(parent: pid N) \(.*\)$"), r"\1 (COMMAND LINE)"),  # a leak report's
    (re.compile(r"_{3,}"), "___"),  # pytest's rulers, as wide as the terminal
    # How many members are still zombies at the final check is a race (below).
    (re.compile(r"\d+ (terminated member\(s\) were left as zombies)"), r"N \1"),
    (re.compile(r"pid N \[zombie\](, pid N \[zombie\])*"), "pid N [zombie]..."),
    (re.compile(r"\b\d+\.\d\d ms\b"), "T ms"),  # doctor's measured spawn costs
    (re.compile(r"\s+$"), ""),
]

# Lines whose presence varies from run to run or machine to machine: when
# only one side has such a line, it is ignored; when both have it, it is
# compared like any other.
UNSTABLE = [
    # A member terminated by the teardown whose parent died with it is a
    # zombie until init reaps it, which may or may not happen before the
    # final check.
    re.compile(r"were left as zombies for their parent or init to reap"),
    # `procown doctor`'s note on the cgroup2 mount options of this machine.
    re.compile(r"^note: cgroup2 is mounted without favordynmods"),
    # `procown doctor`'s line on a Slurm cluster, which depends on the machine.
    re.compile(r"^slurm \(--domain slurm, never picked by auto\)"),
    # `procown doctor`'s measured spawn costs: only where the spawner places commands.
    re.compile(r"^cgroup spawn cost \(measured now"),
]


def normalise(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        for pattern, replacement in NORMALISE:
            line = pattern.sub(replacement, line)
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


def drop_unstable(expected: list[str], actual: list[str]) -> tuple[list[str], list[str]]:
    for pattern in UNSTABLE:
        in_expected = any(pattern.search(line) for line in expected)
        in_actual = any(pattern.search(line) for line in actual)
        if in_expected != in_actual:
            expected = [line for line in expected if not pattern.search(line)]
            actual = [line for line in actual if not pattern.search(line)]
    return expected, actual


def is_ellipsis(line: str) -> bool:
    return line.strip() in ("...", "- ...")


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line; an ellipsis line matches any number of lines."""
    if not expected:
        return not actual
    if is_ellipsis(expected[0]):
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def check_shown(shown: Block, printed: str, what: str) -> None:
    expected, actual = drop_unstable(normalise(shown.code), normalise(printed))
    if not matches(expected, actual):
        diff = "\n".join(difflib.unified_diff(expected, actual, "shown", "printed", lineterm=""))
        pytest.fail(f"{shown.id}: the sample differs from what {what} prints (normalised):\n{diff}")


def needs_cgroup(text: str) -> bool:
    return (
        "domain=cgroup" in text
        or "/sys/fs/cgroup" in text
        or re.search(r"cgroup\s+available", text) is not None
    )


def cgroup_available() -> bool:
    return any(d.name == "cgroup" and d.available for d in trio_procown.available_domains())


NEEDS_CGROUP = pytest.mark.skipif(
    not cgroup_available(), reason="the sample shows the cgroup domain, which this machine lacks"
)


# -- the tests -----------------------------------------------------------------------


def example_params() -> list[object]:
    params: list[object] = []
    for block in EXAMPLES:
        marks = [
            pytest.mark.xfail(strict=True, reason=reason)
            for text, reason in KNOWN_BUGS
            if block.synopsis and text in block.code and "run" in preludes_for(block.code)
        ]
        reason = block.option("skip")
        if reason is not None:
            marks.append(pytest.mark.skip(reason=f"marked as a fragment: {reason}"))
        if block.output is not None and needs_cgroup(block.output.code):
            marks.append(NEEDS_CGROUP)
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


def transcript_params() -> list[object]:
    return [
        pytest.param(block, id=block.id, marks=[NEEDS_CGROUP] if needs_cgroup(block.code) else [])
        for block in TRANSCRIPTS
    ]


@pytest.mark.parametrize("block", example_params())
async def test_example_runs(block: Block, tmp_path: Path) -> None:
    printed = await run_example(block, tmp_path)
    if block.output is not None:
        check_shown(block.output, printed, f"the example at {block.id}")


@pytest.mark.parametrize("block", transcript_params())
async def test_transcript(block: Block, tmp_path: Path) -> None:
    """Each `$ COMMAND` of the transcript is run (`procown` is this package's
    CLI, `$?` the previous command's status); its output must be the lines
    shown under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{block.id}: output before the first command"
            steps[-1][1].append(line)
    status = 0
    for command, shown in steps:
        argv = shlex.split(command.replace("$?", str(status)))
        if argv[0] == "procown":
            argv = [sys.executable, "-m", "trio_procown", *argv[1:]]
        elif argv[0] == "echo":
            argv = ["sh", "-c", command.replace("$?", str(status))]
        status, printed = await run_command(argv, tmp_path)
        step = Block(block.path, block.line, "text", "\n".join(shown) + "\n")
        check_shown(step, printed, f"`{command}`")


def test_examples_are_collected() -> None:
    """The collection itself: every page with code has its examples found,
    and markdown examples are self-contained (no prelude)."""
    ids = {b.id.split(":")[0] for b in EXAMPLES}
    assert {"README.md", "docs/quickstart.md", "docs/receipts.md", "src/trio_procown/_command.py"} <= ids
    assert TRANSCRIPTS, "no transcript found"
    for block in EXAMPLES:
        for part in block.project:  # a page's support files are used by a test module of it
            assert any(b.project is block.project and is_test_module(b.code) for b in EXAMPLES), part.id
        if block.synopsis or block.option("skip") is not None:
            continue
        missing = free_names(block.code)
        assert not missing, f"{block.id} uses {sorted(missing)} without defining or importing them"


def test_fragments_are_few() -> None:
    skipped = [b.id for b in EXAMPLES if b.option("skip") is not None]
    assert len(skipped) <= 3, skipped


# -- the benchmark figures quoted in the prose ------------------------------------------

QUOTE = [sys.executable, "-m", "benchmarks.quote"]


async def test_benchmark_quotes_are_current() -> None:
    """README.md and docs/comparison.md quote benchmarks/results/latest.json
    (the run's header, the correctness table, the cost figures and their
    targets' verdicts) between ``<!-- quote:NAME -->`` markers: the quotes
    are what ``python -m benchmarks.quote`` renders from the committed
    results (no benchmark is run)."""
    status, text = await run_command([*QUOTE, "--check"], ROOT)
    assert status == 0, (
        f"the quoted figures drifted from the results; run `python -m benchmarks.quote`:\n{text}"
    )


async def test_benchmark_quotes_follow_the_verdicts(tmp_path: Path) -> None:
    """The verdict phrases follow the data: the committed results with some
    targets flipped, and at every mass-teardown point no block past its
    bound but a 1 s event-loop stall, rendered into copies."""
    results = ROOT / "benchmarks" / "results"
    data = json.loads((results / "latest.json").read_text(encoding="utf-8"))
    verdicts = {
        "run_owned process-group / trio.run_process capture": "met",
        "run_owned cgroup / trio.run_process capture": "met",
        "run_owned process-group after 50 ms idle / trio.run_process capture": "met",
        "run_owned cgroup after 50 ms idle / trio.run_process capture": "met",
        "deadline→return upper bound, cgroup": "met",
        "deadline→return upper bound, process-group": "MISSED",
        "procown run -- true / import trio": "met",
    }
    for section in data["sections"]:
        for target in section["targets"]:
            target["verdict"] = verdicts.get(target["name"], target["verdict"])
        for point in section["data"].get("mass", {}).values() if section["key"] == "scaling" else []:
            point["blocks_over_limit"], point["max_loop_stall_seconds"] = [0], [1.0]
    (tmp_path / "latest.json").write_text(json.dumps(data), encoding="utf-8")
    lines = (results / "latest.md").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):  # the mass-teardown table, for results without "mass" in the JSON
        cells = line.split(" | ")
        if len(cells) == 11 and cells[2] in ("cgroup", "process-group") and "/" in cells[5]:
            cells[5], cells[7] = f"0/{cells[0].strip('| ')}", "1000.00"
            lines[i] = " | ".join(cells)
    (tmp_path / "latest.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    status, text = await run_command(
        [*QUOTE, "--results", str(tmp_path / "latest.json"), "--out-dir", str(tmp_path / "out")], ROOT
    )
    assert status == 0, text
    readme = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    for phrase in [
        "process-group, ≤ 1.30 x for cgroup, in the interleaved rounds and after 50 ms idle) were\n  met.",
        "target of ≤ 20 ms was met for cgroup, missed for process-group in this run.",
        "the target of ≤ 1.15 x was met\n  in this run",
        "every block within its\n  bound, 0 survivors, but the event loop stalled up to 1000.00 ms",
        "0 survivors, and\n  every block ended within its bound, but the event\n"
        "  loop stalled up to 1000.00 ms",
        "the target of every block within its bound was met there,\n  that of a stall ≤ 20 ms missed.",
    ]:
        assert phrase in readme, phrase


async def test_benchmark_quote_of_repeated_mass_points_gives_the_worst_run(tmp_path: Path) -> None:
    """Where the largest mass-teardown point ran several times, the quote
    gives its worst run and how many runs had a block past the bound, not
    one run's draw: the committed results with that point's runs rewritten
    (three a domain, one of them with 7 blocks past), rendered into a copy."""
    results = ROOT / "benchmarks" / "results"
    data = json.loads((results / "latest.json").read_text(encoding="utf-8"))
    scaling = next(s for s in data["sections"] if s["key"] == "scaling")
    last = max(int(key.split()[0]) for key in scaling["data"]["mass"])
    for key, point in scaling["data"]["mass"].items():
        if int(key.split()[0]) == last:
            point["blocks_over_limit"] = [0, 7, 0] if key.endswith("cgroup") else [0, 0, 0]
    (tmp_path / "latest.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "latest.md").write_text((results / "latest.md").read_text(encoding="utf-8"), encoding="utf-8")
    status, text = await run_command(
        [*QUOTE, "--results", str(tmp_path / "latest.json"), "--out-dir", str(tmp_path / "out")], ROOT
    )
    assert status == 0, text
    readme = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    phrase = (
        f"7 of {2 * last:,} blocks passed their bound (the receipts say so) in the worst run of\n"
        "  each domain; 1 of 6 runs had a block past it"
    )
    assert phrase in readme, phrase
    assert "the teardown\n  took up to " in readme
