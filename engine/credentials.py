"""Secrets (hub token, API keys) kept in the operating system's keyring, never in a file or a log."""

from __future__ import annotations

import logging

import keyring
import keyring.errors

from engine.errors import KeyringError

SERVICE = "inference-studio"
HUB_TOKEN = "huggingface-token"

log = logging.getLogger(__name__)


def get_secret(name: str) -> str | None:
    """The stored secret, or None when there is none or no keyring is available."""
    try:
        return keyring.get_password(SERVICE, name)
    except keyring.errors.KeyringError as exc:
        log.warning("keyring unavailable while reading %r: %s", name, type(exc).__name__)
        return None


def read_secret(name: str) -> str | None:
    """The stored secret or None when there is none; raises KeyringError when the keyring cannot be read (locked,
    missing): for callers that must not carry on as if no secret were set (a server that requires a key)."""
    try:
        return keyring.get_password(SERVICE, name)
    except keyring.errors.KeyringError as exc:
        raise KeyringError(
            f"could not read {name!r} from the system keyring ({type(exc).__name__}); unlock the keyring "
            "(e.g. gnome-keyring, KWallet, macOS Keychain) and try again"
        ) from None


def set_secret(name: str, value: str) -> None:
    if not value:
        delete_secret(name)
        return
    try:
        keyring.set_password(SERVICE, name, value)
    except keyring.errors.KeyringError as exc:
        raise KeyringError(
            f"could not store {name!r} in the system keyring ({type(exc).__name__}); "
            "install or unlock a keyring backend (e.g. gnome-keyring, KWallet, macOS Keychain)"
        ) from None


def delete_secret(name: str) -> None:
    try:
        keyring.delete_password(SERVICE, name)
    except keyring.errors.PasswordDeleteError:
        pass
    except keyring.errors.KeyringError as exc:
        raise KeyringError(f"could not delete {name!r} from the system keyring ({type(exc).__name__})") from None


def hub_token() -> str | None:
    return get_secret(HUB_TOKEN)
