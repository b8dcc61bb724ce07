"""The exception Kiln's Python entry raises for what the Kiln binary refuses."""


class KilnError(RuntimeError):
    """The Kiln binary refused the model or the request, or a compiled step failed; the message is
    Kiln's own."""
