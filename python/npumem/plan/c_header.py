"""Text for the C headers a plan writes: identifiers, string literals and comments.

Names in a plan come from input files (buffer ids, tensor names, the problem's name), so any
text may reach a header. Each helper turns arbitrary text into something that keeps its place in
C99 (compiled with `-Wall -Wextra -pedantic`): an identifier, a string literal holding exactly
that text's UTF-8 bytes, or text that cannot end, nest or leave the comment it is in.
"""

from __future__ import annotations

import re

__all__ = ["c_comment", "c_identifier", "c_string"]


def c_identifier(text: str, default: str = "npumem_plan") -> str:
    """`text` as a C identifier: every character outside `[0-9A-Za-z_]` becomes `_`, a
    leading digit gets a `_` in front, and empty text gives `default`."""
    ident = re.sub(r"[^0-9A-Za-z_]", "_", text) or default
    return f"_{ident}" if ident[0].isdigit() else ident


def c_string(text: str) -> str:
    """`text` as a C string literal: quotes and backslashes escaped, `?` escaped (no trigraph
    can form), every other character outside printable ASCII as octal escapes of its UTF-8
    bytes."""
    out = []
    for ch in text:
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.extend(f"\\{byte:03o}" for byte in ch.encode("utf-8", "surrogatepass"))
    return '"' + "".join(out) + '"'


_COMMENT_BREAKERS = re.compile(r"\*(?=/)|/(?=\*)|\?(?=\?)")


def c_comment(text: str) -> str:
    """`text` made safe inside a C block comment: on one line, printable ASCII only (other
    characters written as Python escapes such as `\\n` or `\\xe9`), and a space put
    into every `*/`, `/*` and `??` so that the comment can neither end nor nest and no
    trigraph forms."""
    printable = "".join(ch if 32 <= ord(ch) < 127 else ascii(ch)[1:-1] for ch in text)
    return _COMMENT_BREAKERS.sub(lambda m: m.group() + " ", printable)
