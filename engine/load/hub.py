"""Download a model repository from the Hugging Face hub into its normal cache, with the keyring token."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.credentials import hub_token
from engine.errors import HubError

log = logging.getLogger(__name__)

# Only what a causal LM needs; skips other frameworks' weights and large extras in mixed repos.
MODEL_FILE_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.model",
    "*.txt",
    "*.jinja",
    "tokenizer*",
]


def download_repo(
    repo_id: str, revision: str | None = None, token: str | None = None, config_only: bool = False
) -> Path:
    """Local snapshot folder of the repo: the cache when it is complete there, else a download.
    config_only fetches just config.json (enough for a memory estimate)."""
    from huggingface_hub import errors as hub_errors
    from huggingface_hub import snapshot_download

    token = token or hub_token()
    patterns = ["config.json"] if config_only else MODEL_FILE_PATTERNS
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True))
    except hub_errors.LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a malformed local cache: fall through to a fresh download
        log.debug("cached snapshot of %s unusable: %s", repo_id, exc)

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=patterns, token=token)
    except hub_errors.GatedRepoError:
        raise HubError(
            f"{repo_id} is gated: accept its license on huggingface.co and store a hub token in Settings"
        ) from None
    except hub_errors.RepositoryNotFoundError:
        hint = "" if token else " (if it is private, store a hub token in Settings)"
        raise HubError(f"no repository {repo_id!r} on the hub{hint}") from None
    except hub_errors.RevisionNotFoundError:
        raise HubError(f"{repo_id} has no revision {revision!r}") from None
    except hub_errors.LocalEntryNotFoundError:
        raise HubError(
            f"cannot reach the hub to download {repo_id} and it is not in the local cache; "
            "check the network, or pass a local folder or .gguf file"
        ) from None
    except hub_errors.HfHubHTTPError as exc:
        raise HubError(f"the hub refused {repo_id}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise HubError(f"downloading {repo_id} failed: {exc}") from None
    return Path(folder)
