"""Masking of credentials in storage and tracking URLs before anything prints, logs, raises or tags them."""

from __future__ import annotations

import re

#: ``scheme://user:password@host``, or ``user:password@host`` without a scheme (a mistyped URL is echoed in its
#: error line): the password part (up to the ``@`` before the host).
_URL_PASSWORD = re.compile(r"(?P<head>(?:[A-Za-z][A-Za-z0-9+.\-]*://)?[^\s:/@]*:)(?P<secret>[^\s@/]*)@")
#: ``password=...`` in libpq-style connection strings and driver messages.
_KEY_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<secret>'[^']*'|\"[^\"]*\"|[^\s&;,)]+)", re.IGNORECASE)
MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with every URL password (``user:***@host``) and ``password=...`` value replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _KEY_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
