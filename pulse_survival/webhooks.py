"""Signed webhooks, in the Standard Webhooks scheme (www.standardwebhooks.com).

Each POST carries three headers: `webhook-id` (the notice's effect id, the same on every
retry), `webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,` and the base64
HMAC-SHA256 of `{id}.{timestamp}.{body}` under the secret). A receiver that knows the secret
can tell pulse's call from anyone else's, and refuse a replay whose timestamp is old.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from pulse_core import PulseError

SECRET_PREFIX = "whsec_"
"""What every webhook secret starts with; base64 of the key's bytes follows."""

KEY_BYTES = (24, 64)
"""The shortest and longest key a secret may hold, in bytes (the scheme's bounds)."""


class WebhookSecretInvalid(PulseError):
    """A webhook secret is not `whsec_` followed by the base64 of 24 to 64 bytes. The message
    never repeats the secret."""


def new_webhook_secret() -> str:
    """A fresh random secret (32 bytes), in the form `notify.webhook_secret` takes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def webhook_key(secret: str) -> bytes:
    """The key bytes of `secret`; a WebhookSecretInvalid saying how to make a good one
    otherwise."""
    how = ("make one with `python -c \"from pulse_survival import new_webhook_secret; "
           "print(new_webhook_secret())\"`")
    if not secret.startswith(SECRET_PREFIX):
        raise WebhookSecretInvalid(f"a webhook secret starts with {SECRET_PREFIX!r} — {how}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSecretInvalid(
            f"a webhook secret is {SECRET_PREFIX!r} followed by base64 — {how}") from None
    low, high = KEY_BYTES
    if not low <= len(key) <= high:
        raise WebhookSecretInvalid(
            f"a webhook secret holds {low} to {high} bytes of key, this one {len(key)} — {how}")
    return key


def sign_webhook(secret: str, message_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    """The three headers that sign `body` as message `message_id` sent at `timestamp_s`."""
    signed = f"{message_id}.{timestamp_s}.".encode() + body
    digest = hmac.new(webhook_key(secret), signed, hashlib.sha256).digest()
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp_s),
            "webhook-signature": "v1," + base64.b64encode(digest).decode("ascii")}
