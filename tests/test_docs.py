"""The docs hold together: README.md stays short, every relative link in README.md and docs/*.md
resolves (the file, and the heading when it names one), every docs page is reachable from README.md,
and docs/configuration.md documents every run-config key of pyproject.toml with its default."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
README_MAX_LINES = 300
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
NAME = re.compile(r"`([a-z0-9-]+)`")


def _without_code(text: str) -> str:
    """The text with fenced blocks and inline code removed: neither holds links or headings."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file, or heading anchor, does not exist, with the reason."""
    broken = []
    for target in LINK.findall(_without_code(page.read_text(encoding="utf-8"))):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    return broken


def documented_defaults(path: Path) -> dict[str, str]:
    """Key -> default cell text, from every table row of `path` whose first cell names keys in backticks;
    a row `| \\`a\\`, \\`b\\` | 1, 2 | ... |` documents both keys, with one default each."""
    documented = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3:
            continue
        keys = NAME.findall(cells[0])
        defaults = [value.strip() for value in cells[1].split(", ")]
        if keys and len(keys) == len(defaults):
            documented.update(zip(keys, defaults))
        elif keys:
            documented.update({key: f"<{len(defaults)} defaults for {len(keys)} keys>" for key in keys})
    return documented


def _same_default(documented: str, actual: object) -> bool:
    """Whether a default as the docs write it (`digits`, `""`, false, 1e-5, 4194304) equals pyproject's."""
    text = documented.strip("`")
    if isinstance(actual, bool):
        return text == str(actual).lower()
    if isinstance(actual, int | float):
        try:
            return float(text) == float(actual)
        except ValueError:
            return False
    return text == (actual if actual else '""')


def run_config() -> dict[str, object]:
    """The run-config keys and defaults of pyproject.toml, [tool.flwr.app.config]."""
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["tool"]["flwr"]["app"]["config"]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_readme() -> None:
    targets = LINK.findall(_without_code(README.read_text(encoding="utf-8")))
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in targets}
    unlinked = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert unlinked == [], f"docs pages that README.md does not link to: {unlinked}"


def test_every_run_config_key_is_documented() -> None:
    keys, documented = set(run_config()), set(documented_defaults(CONFIGURATION))
    missing, stale = sorted(keys - documented), sorted(documented - keys)
    assert missing == [], f"run-config keys missing from docs/configuration.md's table: {missing}"
    assert stale == [], f"docs/configuration.md documents keys that pyproject.toml lacks: {stale}"


def test_documented_defaults_match_pyproject() -> None:
    documented = documented_defaults(CONFIGURATION)
    wrong = {key: (documented[key], value) for key, value in run_config().items()
             if key in documented and not _same_default(documented[key], value)}
    assert wrong == {}, "docs/configuration.md's default (first) differs from pyproject.toml's (second)"


def test_the_checks_catch_a_broken_link_and_an_undocumented_key(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Twice\n\n## Twice\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Running with plain `flwr run .`\n\n[ok](other.md#twice-1) [ok](#running-with-plain-flwr-run-) "
        "[web](https://flower.ai) `[code](missing.md)`\n[gone](missing.md) [no heading](other.md#not-a-heading)\n"
    )
    assert [reason.split(":")[0] for reason in broken_links(page)] == ["missing.md", "other.md#not-a-heading"]
    table = tmp_path / "keys.md"
    table.write_text(
        "| key | default | meaning |\n| --- | --- | --- |\n| `a`, `b` | 1.0, `x` | two |\n| `c` | 1, 2 | bad |\n"
    )
    documented = documented_defaults(table)
    assert documented["a"] == "1.0" and documented["b"] == "`x`" and documented["c"].startswith("<2 defaults")
    assert _same_default(documented["a"], 1) and not _same_default(documented["b"], "y")
    assert _same_default('`""`', "") and _same_default("false", False) and not _same_default("1e-5", 1e-4)
