"""Markdown from untrusted text (a model's reply, an imported chat) as HTML for Qt's text documents: raw HTML is shown
as the text it is, links are http/https only and show their real target, images are never loaded."""

from __future__ import annotations

import html
import re
from functools import cache

from markdown_it import MarkdownIt

LINK_SCHEMES = ("http://", "https://")
TARGET_SHOWN_CHARS = 60  # a link's target is written after its text, shortened to this many characters
_PRE = re.compile(r"(<pre.*?</pre>)", re.DOTALL)


def is_safe_link(url: str) -> bool:
    """Only the web: no file:, smb:, javascript:, data:, nor a relative path that would resolve to a local file."""
    return url.strip().lower().startswith(LINK_SCHEMES)


def short_target(url: str) -> str:
    return url if len(url) <= TARGET_SHOWN_CHARS else url[: TARGET_SHOWN_CHARS - 1] + "…"


def _link_text(tokens, close_index: int) -> tuple[int, str]:
    """The link_open token before `close_index` and the visible text between them."""
    parts: list[str] = []
    index = close_index - 1
    while index >= 0 and tokens[index].type != "link_open":
        if tokens[index].type in ("text", "code_inline"):
            parts.append(tokens[index].content)
        index -= 1
    return index, "".join(reversed(parts))


def _render_link_open(self, tokens, idx, options, env) -> str:
    url = tokens[idx].attrGet("href") or ""
    return f'<a href="{html.escape(url)}" title="{html.escape(url)}">'


def _render_link_close(self, tokens, idx, options, env) -> str:
    """A link whose text is not its own target gets the target written after it: `[python.org](https://evil)` must
    not pass for python.org."""
    open_index, text = _link_text(tokens, idx)
    url = (tokens[open_index].attrGet("href") or "") if open_index >= 0 else ""
    if text.strip() in (url, url.removeprefix("https://"), url.removeprefix("http://"), f"<{url}>"):
        return "</a>"
    return f'</a> <span style="font-size: small">({html.escape(short_target(url))})</span>'


def _render_image(self, tokens, idx, options, env) -> str:
    """An image is never loaded (a local file, a tracking pixel): it shows as a link to where it is, with its alt."""
    token = tokens[idx]
    url = token.attrGet("src") or ""
    alt = self.renderInlineAsText(token.children or [], options, env) or "image"
    return f'[image: {html.escape(alt)}] <a href="{html.escape(url)}" title="{html.escape(url)}">' + (
        f"{html.escape(short_target(url))}</a>"
    )


def _render_table_open(self, tokens, idx, options, env) -> str:
    return '<table border="1" cellspacing="0" cellpadding="4">\n'


@cache
def parser() -> MarkdownIt:
    """CommonMark with GitHub's tables and strikethrough; no HTML; a line break in the text is a line break (chat
    replies and poems mean it so)."""
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.validateLink = is_safe_link  # any other link stays the literal text it was written as
    md.add_render_rule("link_open", _render_link_open)
    md.add_render_rule("link_close", _render_link_close)
    md.add_render_rule("image", _render_image)
    md.add_render_rule("table_open", _render_table_open)
    return md


def to_html(markdown: str) -> str:
    """The HTML Qt shows for `markdown`; everything in it came from the renderer above, never from the text."""
    # the renderer's newlines between tags would read as spaces (at a paragraph's end, a line's start); in code they
    # are the code's own
    parts = _PRE.split(parser().render(markdown))
    return "".join(part if part.startswith("<pre") else part.replace(">\n", ">") for part in parts)


def plain_html(text: str) -> str:
    """Text to show as it is (a title, a name) where Qt would otherwise guess it is rich text."""
    return html.escape(text).replace("\n", "<br>")
