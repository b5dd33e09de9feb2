"""Text pulse passes on but did not write: a log line, a transcript, a model's output."""

from __future__ import annotations

import msgspec


class Quote(msgspec.Struct, frozen=True, kw_only=True):
    """Untrusted text carried inside a notice as data, never as pulse's own words.

    `source` names where the text was read (for example `error-log` or a log file's path);
    `text` is the text as read. Hosts render a quote fenced and labelled with its source
    (`pulse_adapters.agents.fence_untrusted`), so words in it ("ignore previous
    instructions ...") reach the agent as something quoted, not as an instruction.
    """

    source: str
    text: str
