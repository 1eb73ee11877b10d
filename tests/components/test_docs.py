"""The documentation: README.md is the front door and docs/ the reference site (mkdocs.yml). The configuration
reference is generated from the settings Pulumi.yaml is made from, and a README link into docs/ that names a missing
page or anchor fails here (links between the site's own pages, and pages missing from its nav, fail
`mkdocs build --strict` in scripts/lint.sh).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml

from components.config import all_settings
from scripts.config_docs import (CONFIG_PAGE, DOCS_BEGIN, DOCS_END, change_effects, render_config_reference,
                                 update_config_page)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# A markdown link's target: [text](target) (no title in this repository's links).
LINK = re.compile(r"\]\(([^)\s]+)\)")
ANCHOR_ID = re.compile(r'\bid="([^"]+)"')


def test_the_configuration_reference_is_generated_from_the_settings():
    page = CONFIG_PAGE.read_text()
    assert page == update_config_page(page), "docs/configuration.md is stale: run `python scripts/config_docs.py`"


def test_every_setting_says_what_a_change_does_and_no_entry_names_a_gone_key():
    effects = change_effects()
    assert set(effects) == set(all_settings())
    assert all(text.strip() for text in effects.values())


def reference_rows() -> dict[str, list[str]]:
    """key -> the cells of its row in the generated block."""
    rows = {}
    for line in render_config_reference().splitlines():
        if match := re.match(r'\| <span id="([^"]+)"></span>`\1` \| (.*) \|$', line):
            rows.setdefault(match[1], []).append(match[2])
    return rows


def test_each_key_is_in_the_reference_once_with_pulumi_yamls_default_and_description():
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    rows = reference_rows()
    assert sorted(rows) == sorted(all_settings())
    for key, [row] in rows.items():
        default, doc, effect = row.split(" | ")
        assert effect == change_effects()[key].replace("|", "\\|")
        if key not in declared:  # hfToken and labels: Pulumi's schema cannot declare them
            continue
        assert doc == declared[key]["description"].replace("|", "\\|")
        want = declared[key].get("default")
        if want in (None, ""):
            assert default in ("—", "empty"), key
        elif isinstance(want, list):
            assert default == (", ".join(f"`{item}`" for item in want) or "`[]`"), key
        else:
            assert default == f"`{str(want).lower() if isinstance(want, bool) else want}`", key


def test_the_generated_block_needs_its_markers():
    with pytest.raises(ValueError, match="markers"):
        update_config_page("# Configuration\n\nno block here\n")
    page = f"prose before\n{DOCS_BEGIN}\nold table\n{DOCS_END}\nprose after\n"
    updated = update_config_page(page)
    assert updated.startswith("prose before\n" + DOCS_BEGIN) and updated.endswith(DOCS_END + "\nprose after\n")
    assert "old table" not in updated and "`keepCaches`" in updated


@functools.cache
def markdown_renderer():
    """A Markdown converter with the site's own extensions (mkdocs.yml), so heading ids are the site's (GitHub's
    slugs: pymdownx.slugs) and raw `<span id>` anchors count, as they do for mkdocs' anchor validation."""
    import markdown
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    return markdown.Markdown(extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"])


def anchors(path: Path) -> set[str]:
    md = markdown_renderer()
    md.reset()
    return set(ANCHOR_ID.findall(md.convert(path.read_text())))


def broken_links(text: str, base: Path) -> list[str]:
    """The relative links of a markdown text (at `base`) whose file, or anchor in a markdown file, is missing."""
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (base.parent / path) if path else base
        if not file.exists():
            problems.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{target}: {file.name} has no anchor #{anchor}")
    return problems


def test_every_readme_link_into_the_docs_finds_its_page_and_anchor(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)  # docs/index.md's snippet paths are relative to the repository's root
    text = README.read_text()
    assert any(target.startswith("docs/") for target in LINK.findall(text))
    assert broken_links(text, README) == []


def test_a_link_to_a_missing_page_or_anchor_is_reported():
    readme = ROOT / "README.md"
    text = ("[ok](docs/configuration.md#keepCaches) [heading](docs/deploy.md#tearing-it-down-and-what-is-kept) "
            "[page](docs/nosuch.md) [anchor](docs/configuration.md#noSuchKey) [web](https://example.com/x.md#y)")
    assert broken_links(text, readme) == ["docs/nosuch.md: no file docs/nosuch.md",
                                          "docs/configuration.md#noSuchKey: configuration.md has no anchor #noSuchKey"]


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines() if not line.startswith(" ")]
    assert commands == ["scripts/up.sh dev", "scripts/test.sh"]
    assert "exec scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_a_front_door():
    """The reference belongs in docs/ (one page per area); the README says what it is, how to start, what it costs,
    how to tear down, and where to read on."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 180, f"README.md has {len(lines)} lines: move reference material into a docs/ page"
    headings = [line for line in lines if line.startswith("## ")]
    for needed in ("Quick start on a laptop", "What it costs", "Tearing it down", "Where to go next"):
        assert f"## {needed}" in headings



def test_what_the_laptop_quick_start_writes_in_the_checkout_is_ignored(tmp_path: Path):
    """Issue 34 item 9: `vllm.log` and `runs/` showed up in `git status` after the quick start."""
    import shutil
    import subprocess

    laptop = README.read_text() + (ROOT / "docs" / "toolkit.md").read_text()
    written = set(re.findall(r"> (\S+) 2>&1", laptop)) | {path.split("/")[0] + "/" for path in
                                                         re.findall(r"--out (runs/\S+)", laptop)}
    assert written == {"vllm.log", "runs/"}
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    checked = subprocess.run(["git", "check-ignore", *(name + ("x" if name.endswith("/") else "") for name in written)],
                             cwd=tmp_path, capture_output=True, text=True)
    assert sorted(checked.stdout.split()) == ["runs/x", "vllm.log"]


def test_the_exit_code_table_is_tpuserve_exits() -> None:
    """docs/toolkit.md#exit-codes says what tpuserve/exits.py says, code by code, and no code means two things."""
    import ast

    from tpuserve import exits

    source = (ROOT / "tpuserve" / "exits.py").read_text()
    meanings = {}
    for line in source.splitlines():
        name, _, rest = line.partition(" = ")
        if rest and name.isupper():
            value, _, comment = rest.partition("  # ")
            meanings[int(ast.literal_eval(value))] = comment
    assert sorted(meanings) == sorted({getattr(exits, n) for n in dir(exits) if n.isupper()})
    page = (ROOT / "docs" / "toolkit.md").read_text()
    rows = dict(line.strip("| ").split(" | ", 1) for line in page.split("## Exit codes", 1)[1].split("\n## ")[0]
                .splitlines() if line.startswith("| ") and line[2].isdigit())
    assert {int(code): text.rstrip(" |") for code, text in rows.items()} == meanings
