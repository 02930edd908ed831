"""Error types the CLI reports as one clear message (no traceback): bad config, bad input, bad plan."""


class MlmError(RuntimeError):
    """Base class: a problem the user can fix; the message names the file, line or key."""


class SourceError(MlmError, ValueError):
    """A source that cannot be read at all (missing file, no matching glob, missing column)."""


class PlanError(MlmError):
    """A run that cannot start: an upstream output is missing, an unknown stage name..."""


class StageError(MlmError):
    """A stage that ran but whose result is unusable (e.g. too much of the input quarantined)."""


# `mlm run` exit statuses (README, "When things go wrong"): 0 success, 1 unexpected error, 2 an error the user
# fixes (config, data, disk), 3 the run completed and registered its model but the promotion gates failed,
# 128+N stopped by signal N (130 SIGINT, 143 SIGTERM).
EXIT_GATES_FAILED = 3


class GatesFailed(MlmError):
    """The run completed and registered its model, but promotion gates failed, and ``registry.fail_on_gates``
    asks for the flow run to end Failed. ``results`` holds the stage results (the run's table is still printed)."""

    exit_code = EXIT_GATES_FAILED

    def __init__(self, message: str, results: list | None = None):
        super().__init__(message)
        self.results = results or []
