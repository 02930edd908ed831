"""Credentials of ``mlm serve``: ``user:password`` from ``--auth-file`` or ``$MLM_SERVE_AUTH``, and the
MLflow basic-auth app's CSRF key. Stdlib only (``mlm --help`` stays instant)."""
from __future__ import annotations

import os
from pathlib import Path

from flows.procs import ServeError

AUTH_ENV = "MLM_SERVE_AUTH"          # user:password, the alternative to --auth-file
MIN_PASSWORD = 12                    # MLflow's password policy (mlflow.utils.validation._validate_password)


def read_credentials(auth_file: str | None) -> str | None:
    """``user:password`` from ``--auth-file`` (first non-comment line) or ``$MLM_SERVE_AUTH``; None if neither."""
    if auth_file:
        path = Path(auth_file)
        if not path.is_file():
            raise ServeError(f"--auth-file {path}: no such file", 2)
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
        cred = lines[0] if lines else ""
        source = f"--auth-file {path}"
    elif os.environ.get(AUTH_ENV):
        cred, source = os.environ[AUTH_ENV].strip(), f"${AUTH_ENV}"
    else:
        return None
    user, sep, password = cred.partition(":")
    if not sep or not user or not password:
        raise ServeError(f"{source}: expected one line 'user:password'", 2)
    if len(password) < MIN_PASSWORD:
        raise ServeError(f"{source}: the password must have at least {MIN_PASSWORD} characters "
                         "(MLflow's password policy)", 2)
    return cred


def secret_key(path: Path) -> str:
    """The CSRF key MLflow's basic-auth app requires: made once per workdir (0600), stable across restarts."""
    if not path.exists():
        import secrets

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return path.read_text().strip()
