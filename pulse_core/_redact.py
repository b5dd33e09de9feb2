"""Redacting URLs out of error texts before they are stored: the log can never be scrubbed."""

from __future__ import annotations

import re

# A scheme and '://', then everything up to white space, a quote or an angle bracket (a
# backslash is kept in: some write paths with it; so are '{}|^`', which a URL should encode
# but a token written by hand may hold: stopping there would leave the token's rest).
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*)://(?P<body>[^\s\"<>]*)")
_QUERY = re.compile(r"[?#]")
_HOST_END = re.compile(r"[/?#\\{}|^`]")
# Closes a quoted, parenthesised or braced URL, or ends the sentence it stands in.
_CLOSING = "').,;:]!}`|"


def _keep_origin(match: re.Match[str]) -> str:
    body = match["body"]
    kept = body.rstrip(_CLOSING)
    closing = body[len(kept):]
    # User info ends at the last '@' before the query: a password holding '/' is cut too.
    # An authority with a ':' but no '@' may be a password holding '?' or '#' unencoded:
    # then the user info ends at the URL's last '@'.
    authority = _HOST_END.split(kept, maxsplit=1)[0]
    if "@" not in authority and ":" in authority:
        userinfo_end = kept.rfind("@")
    else:
        userinfo_end = _QUERY.split(kept, maxsplit=1)[0].rfind("@")
    host = _HOST_END.split(kept[userinfo_end + 1:], maxsplit=1)[0]
    return f"{match['scheme']}://{host}{closing}"


def redact_urls(text: str) -> str:
    """`text` with every URL cut to its scheme and host (with its port): user names,
    passwords, paths, queries and fragments, where webhook tokens and API keys live, are
    dropped. Nothing before a URL's last '@' (ahead of its query; anywhere in it when what
    precedes its first '/', '?' or '#' holds a ':' but no '@') is ever kept, so a URL whose
    path holds an '@' shows what follows it as its host."""
    return _URL.sub(_keep_origin, text)
