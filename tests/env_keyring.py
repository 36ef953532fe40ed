"""A keyring backend for server subprocesses in tests: secrets come from one environment variable, no file.

Selected with PYTHON_KEYRING_BACKEND=tests.env_keyring.EnvKeyring (keyring's documented override) and
PYTHONPATH at the repository root; real users never set either, so they stay on the OS keyring."""

from __future__ import annotations

import json
import os

import keyring.backend
import keyring.errors

ENV = "INFERENCE_STUDIO_TEST_SECRETS"  # JSON: {"<secret name>": "<value>"} for the service inference-studio
BACKEND = "tests.env_keyring.EnvKeyring"


class EnvKeyring(keyring.backend.KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def _secrets(self) -> dict[str, str]:
        return json.loads(os.environ.get(ENV, "{}"))

    def get_password(self, service: str, username: str) -> str | None:
        return self._secrets().get(username) if service == "inference-studio" else None

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.PasswordSetError("the test keyring is read-only")

    def delete_password(self, service: str, username: str) -> None:
        raise keyring.errors.PasswordDeleteError("the test keyring is read-only")


def subprocess_env(secrets: dict[str, str]) -> dict[str, str]:
    """Environment additions that give a subprocess these secrets through its keyring."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHON_KEYRING_BACKEND": BACKEND, ENV: json.dumps(secrets), "PYTHONPATH": path}
