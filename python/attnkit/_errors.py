"""
_errors.py - the exceptions of the binding. A failed C call raises the class
of its ak_status with ak_last_error()'s message, which names the field
("args.q->dtype = f16, expected f32"); the binding's own checks (device,
buffer bounds) raise InvalidArgument with a message in the same style.
"""


class Error(RuntimeError):
    """A failed attnkit call. status: the ak_status code (None for the binding's
    own checks); status_str: its short text; message: the detailed message."""

    def __init__(self, message, status=None, status_str=None):
        super().__init__(f"{status_str}: {message}" if status_str else message)
        self.message = message
        self.status = status
        self.status_str = status_str


class InvalidArgument(Error, ValueError):
    """AK_ERR_INVALID_ARG, or an argument the binding refused before the call."""


class Unsupported(Error):
    """AK_ERR_UNSUPPORTED: the backend cannot serve this config or batch."""


class BackendNotFound(Error, LookupError):
    """AK_ERR_BACKEND_NOT_FOUND."""


class LimitExceeded(Error, ValueError):
    """AK_ERR_LIMIT_EXCEEDED: a batch above the backend's limits."""


# ak_status -> class; any other failure is a plain Error
BY_STATUS = {1: InvalidArgument, 2: Unsupported, 5: LimitExceeded, 6: BackendNotFound}
