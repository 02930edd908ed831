"""The old path of ``flows.serve.state`` (``flows.cli`` and ``flows.outage`` import it)."""
from flows.serve.state import STATE_FILE, adopt_servers, read_state  # noqa: F401
