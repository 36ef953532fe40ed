"""Typed errors a user can cause; each message says what happened and what to do."""


class StudioError(Exception):
    """A problem the user can fix. Shown as one line, never as a traceback."""


class ModelNotFoundError(StudioError):
    """The model spec points at nothing that exists."""


class ModelFormatError(StudioError):
    """The model exists but its files are missing pieces, corrupt or of an unsupported kind."""


class UnsupportedOptionError(StudioError):
    """A dtype, quantization or device that cannot work on this machine or with this model."""


class ModelTooLargeError(StudioError):
    """The model would not fit in the memory free now: refused before loading (instead of the OS killing us)."""


class HubError(StudioError):
    """The model hub could not be reached or refused the request."""


class InvalidRequestError(StudioError):
    """A generation request with impossible values (empty prompt, bad sampling settings). `param` names the part of
    the request at fault where one is ("logit_bias", "structured", or an API field), so the API can blame it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """The prompt does not fit in the model's context or in the KV-cache pool."""


class KeyringError(StudioError):
    """The operating system's keyring is unavailable or refused an operation."""


class ServeError(StudioError):
    """The API server cannot start: the port is taken, the API key is missing from the keyring."""


class RemoteError(StudioError):
    """A remote OpenAI-compatible endpoint could not be reached, refused the request, or stalled."""


class EngineStoppedError(StudioError):
    """The engine thread is not running (it was shut down, or died and could not be started again)."""
