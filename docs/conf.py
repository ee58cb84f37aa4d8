# Sphinx configuration for trio_procown.
#
# Build (warnings are errors):
#   python -m sphinx -W --keep-going -b html docs docs/_build/html
# or `make docs`, which installs the `docs` extra first.
#
# Pages are Markdown (MyST) except the API reference, which is
# reStructuredText so that autodoc and sphinxcontrib-trio's async markers
# read naturally. Two things depend on files that other parts of the project
# produce, and the build must pass whether or not they exist yet; both are
# decided here, at build time, by rewriting a placeholder line in the source
# as Sphinx reads it (see _fill_placeholders):
#
# - optional pages (chaos.md, pytest-plugin.md) join the table of contents
#   only if they exist: a toctree entry for a missing page is a warning, and
#   so is a page that no toctree lists;
# - the benchmark results (benchmarks/results/latest.md and *.png) are
#   embedded in the comparison page when present, otherwise the page says
#   they were not found. They are pasted in as text (not with {include}) so
#   that their headings fit under ours and a plot the results name but that
#   is missing cannot fail the build.

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = ROOT / "benchmarks" / "results"

# Import the package from the source tree, so the docs build also works
# without an installed copy (the API reference imports it).
sys.path.insert(0, str(ROOT / "src"))

import trio_procown  # noqa: E402

project = "trio_procown"
author = "trio_procown contributors"
copyright = "trio_procown contributors"
version = release = trio_procown.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinxcontrib_trio",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: fenced ```{directive} blocks, `:::` blocks, heading anchors for
# links like [text](lifecycle.md#teardown).
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Sphinx 9 rewrote autodoc; sphinxcontrib-trio (which adds the `async with`,
# `await`, `async for` markers) plugs into the class-based documenters,
# which Sphinx 9 keeps behind this switch. Earlier Sphinx ignores it.
autodoc_use_legacy_class_based = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# Docstrings write `name` for other names (as trio's do): make that a
# cross-reference, shown as code when it does not resolve (a parameter).
default_role = "py:obj"

# No intersphinx: the build must work without network access.

html_theme = "furo"
html_title = f"trio_procown {release}"
pygments_style = "sphinx"
pygments_dark_style = "monokai"
# The receipt's JSON Schema, published at a stable address beside the pages
# (receipts.md links to it and shows it).
html_extra_path = ["receipt.schema.json"]

# Pages written by other parts of the project, listed in the toctree only
# when present (in this order, after the pages that always exist).
OPTIONAL_PAGES = ["pytest-plugin", "chaos"]


def optional_pages() -> list[str]:
    return [name for name in OPTIONAL_PAGES if (HERE / f"{name}.md").is_file()]


def _toctree_entries() -> str:
    return "\n".join(optional_pages())


def _pytest_plugin_link() -> str:
    if "pytest-plugin" in optional_pages():
        return "See [the pytest plugin](pytest-plugin.md) for its options, markers and fixtures."
    return (
        "Its options: `--procown-leaks=fail|warn|off` (or the ini option `procown_leaks`, "
        'or `@pytest.mark.procown_leaks("fail")`); `pytest --help` lists them all.'
    )


_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _embed_results(text: str, where: Path, heading_offset: int) -> str:
    """The results page, rewritten to sit inside ours: headings moved down
    `heading_offset` levels; images and links to files beside it made
    relative to docs/ (or reduced to their text when the file is missing,
    so a half-written results directory cannot break the build)."""
    rel = os.path.relpath(where, HERE)

    def relink(match: re.Match[str]) -> str:
        bang, label, target = match.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        if not (where / target).is_file():
            return f"*({label or target}: not found)*" if bang else label
        return f"{bang}[{label}]({rel}/{target})"

    out: list[str] = []
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence:
            if line.startswith("#"):
                line = "#" * heading_offset + line
            line = _LINK.sub(relink, line)
        out.append(line)
    return "\n".join(out) + "\n"


def _benchmark_section() -> str:
    # The full run's results, else a quick run's (`python -m benchmarks
    # --quick` writes results/quick/). latest.md embeds its own plots;
    # plots it does not mention are shown after it.
    parts: list[str] = []
    for where in (RESULTS, RESULTS / "quick"):
        if (where / "latest.md").is_file() or any(where.glob("*.png")):
            break
    else:
        return (
            "```{note}\nNo benchmark results were found in `benchmarks/results/` when these pages "
            "were built. Run `make bench` and rebuild.\n```\n"
        )
    latest = where / "latest.md"
    text = latest.read_text(encoding="utf-8") if latest.is_file() else ""
    if where != RESULTS:
        parts.append(
            "```{note}\nOnly the results of a quick run (`python -m benchmarks --quick`, fewer "
            "rounds) were found; `make bench` gives the full figures.\n```\n"
        )
    if text:
        parts.append(_embed_results(text, where, heading_offset=2))
    rel = os.path.relpath(where, HERE)
    for image in sorted(where.glob("*.png")):
        if f"({image.name})" in text:
            continue
        title = image.stem.replace("_", " ").replace("-", " ")
        parts.append(f"```{{figure}} {rel}/{image.name}\n:alt: {title}\n:width: 100%\n\n{title}\n```\n")
    return "\n".join(parts)


PLACEHOLDERS = {
    "<!-- optional-pages -->": _toctree_entries,
    "<!-- pytest-plugin-link -->": _pytest_plugin_link,
    "<!-- benchmark-results -->": _benchmark_section,
}


def _fill_placeholders(app: object, docname: str, source: list[str]) -> None:
    text = source[0]
    for marker, fill in PLACEHOLDERS.items():
        if marker in text:
            text = text.replace(marker, fill())
    source[0] = text


# Pages whose text depends on files outside their own source: re-read them
# on every build, so an incremental build notices a page or a result that
# appeared since the last one.
GENERATED_INTO = ["index", "comparison", "services"]


def _always_reread(
    app: object, env: object, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    return GENERATED_INTO


def _drop_acm_return_annotation(
    app: object,
    what: str,
    name: str,
    obj: object,
    options: object,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """`async with f() as x` reads wrong followed by `-> AsyncIterator[X]`
    (the annotation of the generator under @asynccontextmanager)."""
    from sphinxcontrib_trio import sniff_options  # type: ignore[import-untyped]

    if what in ("function", "method") and "async-with" in sniff_options(obj):
        return signature, None
    return None


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("source-read", _fill_placeholders)
    app.connect("autodoc-process-signature", _drop_acm_return_annotation)
    app.connect("env-get-outdated", _always_reread)
    return {"parallel_read_safe": True}
