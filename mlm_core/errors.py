"""Error types the CLI reports as one clear message (no traceback): bad config, bad input, bad plan."""


class MlmError(RuntimeError):
    """Base class: a problem the user can fix; the message names the file, line or key."""


class SourceError(MlmError, ValueError):
    """A source that cannot be read at all (missing file, no matching glob, missing column)."""


class PlanError(MlmError):
    """A run that cannot start: an upstream output is missing, an unknown stage name..."""


class StageError(MlmError):
    """A stage that ran but whose result is unusable (e.g. too much of the input quarantined)."""
