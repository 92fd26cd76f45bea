"""Generates the configuration reference page (reference/configuration.md) at docs build time.

A MkDocs hook (mkdocs.yml `hooks:`): `on_page_markdown` replaces the stub docs/reference/configuration.md with
the page generated from the configuration's JSON Schema (`txnguard config-schema --markdown`, the pydantic models
of `txnguard.proxy.config`), so the reference cannot drift from the code, followed by the two annotated examples
the schema validates. This is the one place the page's content comes from.

Run it alone to print the page: `python docs/gen_config_reference.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = "reference/configuration.md"
EXAMPLES = (("gateway", "deploy/gateway.yaml"), ("sidecar", "deploy/sidecar/sidecar.yaml"))


def render() -> str:
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)  # this checkout's code, also when another txnguard is installed
    from txnguard.proxy import config_reference

    lines = [config_reference.markdown().rstrip(), ""]
    for name, path in EXAMPLES:
        lines += [f"## Example: {name} {{#example-{name}}}", "", f"`{path}`:", "", "```yaml",
                  (ROOT / path).read_text().rstrip(), "```", ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the page's file in the repository is a stub; the site gets the generated page."""
    if page.file.src_uri == PAGE:
        return render()
    return markdown


if __name__ == "__main__":
    print(render())
