"""Plain helpers for the Great Expectations Data Docs pages ``tasks.validation.gx`` renders (no GE import here:
``tasks/validation/gx.py`` stays the only module importing it)."""
from __future__ import annotations

import re
from typing import Any

_OFFLINE_CSS = ("<style>body{font-family:sans-serif;font-size:14px;margin:1em}table{border-collapse:collapse;"
                "margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;vertical-align:top}</style>")


def offline(html: str) -> str:
    """The page without its CDN scripts and style sheets (Bootstrap, jQuery, Vega): MLflow shows an HTML artifact
    in a sandboxed frame, which stayed blank while they loaded, for ever on a machine without internet access.
    GE's own inline styles stay; a few table rules replace Bootstrap's."""
    html = re.sub(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>', "", html)
    html = re.sub(r'<link[^>]*\bhref="https?://[^"]*"[^>]*>', "", html)
    return html.replace("</head>", _OFFLINE_CSS + "</head>", 1)


def plain(obj: Any) -> Any:
    """numpy scalars -> Python numbers, recursively (dicts, lists)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    return obj.item() if type(obj).__module__ == "numpy" and hasattr(obj, "item") else obj
