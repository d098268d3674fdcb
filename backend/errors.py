"""One exception type for bad input: its message is the one line a user sees."""


class SpecLensError(Exception):
    """A user-facing error. The message names the file (or input) and the fix, in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
