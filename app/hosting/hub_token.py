"""The hub token for the settings dialog: stored in and removed from the keyring, and tested against the hub."""

from __future__ import annotations

import logging

from engine.credentials import HUB_TOKEN, delete_secret, get_secret, set_secret
from engine.errors import HubError

log = logging.getLogger(__name__)


def check_hub_token(token: str | None) -> str:
    """Who the token belongs to, as a sentence; HubError with the reason when it can't be confirmed."""
    from huggingface_hub import whoami
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    token = token or get_secret(HUB_TOKEN)
    if not token:
        raise HubError("no token entered and none stored")
    try:
        info = whoami(token=token)
    except OfflineModeIsEnabled:
        raise HubError("the hub is switched to offline mode (HF_HUB_OFFLINE), so the token was not checked") from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            raise HubError("huggingface.co rejected it: the token is wrong, expired or revoked") from None
        raise HubError(f"huggingface.co answered {status or 'with an error'}; try again later") from None
    except Exception as exc:  # no network, DNS, proxy: the transport's own error types vary
        log.debug("whoami failed: %s", type(exc).__name__)
        raise HubError("could not reach huggingface.co (offline?), so the token was not checked") from None
    name = info.get("name") or info.get("fullname") or "an unnamed account"
    return f"The token works: signed in to huggingface.co as {name}."


class KeyringTokens:
    """The settings dialog's TokenAccess, backed by the OS keyring."""

    def stored(self) -> bool:
        return bool(get_secret(HUB_TOKEN))

    def save(self, token: str) -> None:
        set_secret(HUB_TOKEN, token)

    def remove(self) -> None:
        delete_secret(HUB_TOKEN)

    def test(self, token: str | None) -> str:
        return check_hub_token(token)
