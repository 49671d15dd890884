"""MkDocs hooks (mkdocs.yml ``hooks:``): pages generated from the code and from files beside it, on every build.

- ``reference/config.md`` (every config key) and ``reference/cli.md`` (every ``cleaner`` command) come from
  ``flows.reference``, so they cannot drift from the code;
- the threat model (``sandbox/THREAT_MODEL.md``) and the model cards (``assets/<model>/MODEL_CARD.md``) live beside
  what they describe; they are published as ``threat_model.md`` and ``model_cards/<model>.md``, and a page's links
  to them (``../assets/<model>/MODEL_CARD.md``, ``../sandbox/THREAT_MODEL.md``) are rewritten to those pages, so the
  same Markdown links work on the site and in the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
CARD_LINK = re.compile(r"\]\(\.\./assets/([\w.-]+)/MODEL_CARD\.md")
SIBLING_CARD = re.compile(r"\]\(\.\./([\w.-]+)/MODEL_CARD\.md")  # one card's link to another


def on_files(files, config):
    from flows.reference import PAGES

    for name, make in PAGES.items():
        files.append(File.generated(config, f"reference/{name}.md", content=make()))
    files.append(File.generated(config, "threat_model.md", content=(ROOT / "sandbox" / "THREAT_MODEL.md").read_text()))
    for card in sorted(ROOT.glob("assets/*/MODEL_CARD.md")):
        text = SIBLING_CARD.sub(r"](\1.md", card.read_text())
        files.append(File.generated(config, f"model_cards/{card.parent.name}.md", content=text))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    depth = page.file.src_uri.count("/")
    up = "../" * depth
    markdown = CARD_LINK.sub(lambda m: f"]({up}model_cards/{m.group(1)}.md", markdown)
    return markdown.replace("](../sandbox/THREAT_MODEL.md", f"]({up}threat_model.md")
