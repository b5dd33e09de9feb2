"""Redacting URLs out of error texts before they are stored: the log can never be scrubbed."""

from __future__ import annotations

import re

# A scheme and '://', the authority up to the first '/', '?' or '#', then the path, query
# and fragment; either ends at white space or a character no URL holds unencoded.
_URL = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*)://"
    r"(?P<authority>[^\s/?#\"<>\\`{}|^]*)"
    r"(?P<rest>[/?#][^\s\"<>\\`{}|^]*)?"
)
# Closes a quoted or parenthesised URL, or ends the sentence it stands in.
_CLOSING = "').,;:]!"


def _keep_origin(match: re.Match[str]) -> str:
    whole = match["authority"] + (match["rest"] or "")
    closing = whole[len(whole.rstrip(_CLOSING)):]
    host = match["authority"].rpartition("@")[2].rstrip(_CLOSING)  # userinfo ends at the last @
    return f"{match['scheme']}://{host}{closing}"


def redact_urls(text: str) -> str:
    """`text` with every URL cut to its scheme and host (with its port): user names,
    passwords, paths, queries and fragments, where webhook tokens and API keys live, are
    dropped."""
    return _URL.sub(_keep_origin, text)
