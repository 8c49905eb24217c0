"""README is a short tour whose links lead somewhere: the set-up commands CI runs, the licenses of the
files loaded by default, and every relative link of README.md, docs/*.md and research/**/*.md naming an
existing file and, after '#', one of its headings. docs/ is reference: no page but benchmarks.md (the dated
figures) runs over 400 lines; lab notes go to research/notes/."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path: Path) -> list[str]:
    out = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        dest = (path.parent / name).resolve() if name else path
        if not dest.exists():
            out.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md":
            headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
            if anchor not in headings:
                out.append(f"{path.name}: {target} (no such heading)")
    return out


def test_readme_is_a_tour():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README is a tour: deep dives and figures go to docs/"
    assert "make demo" in text and "make test" in text  # .ci/run runs `make test`
    assert "## Licenses" in text and "yolo11n-pose.pt" in text


def test_every_relative_link_resolves(tmp_path):
    bad = tmp_path / "x.md"
    bad.write_text("# Title\n[a](x.md#title) [b](x.md#nope) [c](missing.md) [d](https://example.org)\n")
    assert broken_links(bad) == ["x.md: x.md#nope (no such heading)", "x.md: missing.md (no such file)"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "research").rglob("*.md"))]
    found = [b for p in pages for b in broken_links(p)]
    assert not found, found


def test_docs_are_reference():
    long = {p.name: n for p in sorted((ROOT / "docs").glob("*.md"))
            if p.name != "benchmarks.md" and (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"docs/ pages over 400 lines: {long}; lab notes go to research/notes/, dated figures to benchmarks.md"
