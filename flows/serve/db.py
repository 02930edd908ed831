"""``mlm serve --db postgresql://USER[:PASSWORD]@HOST[:PORT]/NAME``: both servers' stores on PostgreSQL.

SQLite stays the default (one user, one machine). Several workers writing to SQLite hit "database is
locked"; PostgreSQL is what Prefect and MLflow recommend for a shared server.

In: the URL of a PostgreSQL server, a user and a NAME (a database to connect to for the checks; when it does
not exist, the maintenance database ``postgres`` is used instead). Out: two databases on that server, one per application,
``NAME_prefect`` (Prefect server, driver asyncpg, which prefect brings) and ``NAME_mlflow`` (MLflow
backend store, driver psycopg2, named in the URL), created when missing (needs the CREATEDB privilege; else create them
yourself). Two databases, not one: both applications keep their schema version in alembic's default table
``alembic_version``, and they would overwrite each other's. Both create their own tables at start.

Everything is checked before a server starts: the scheme, that the server answers and accepts the login,
and that the two databases exist or can be created; an error names the URL with the password hidden.
Stdlib at import (``mlm --help`` stays instant); psycopg2 is imported when the databases are checked.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from flows.procs import ServeError

SCHEMES = ("postgresql", "postgres")
SUFFIXES = {"prefect": "_prefect", "mlflow": "_mlflow"}


@dataclass(frozen=True)
class PgDatabase:
    """A parsed ``--db`` URL."""
    user: str
    password: str | None
    host: str
    port: int
    name: str
    query: str = ""

    def url(self, name: str | None = None, driver: str | None = None, hide_password: bool = False) -> str:
        scheme = "postgresql" + (f"+{driver}" if driver else "")
        cred = urllib.parse.quote(self.user, safe="")
        if self.password is not None:
            cred += ":" + ("***" if hide_password else urllib.parse.quote(self.password, safe=""))
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{cred}@{host}:{self.port}/{name or self.name}" + (f"?{self.query}" if self.query else "")

    @property
    def shown(self) -> str:
        return self.url(hide_password=True)

    def prefect_url(self) -> str:
        """SQLAlchemy URL of Prefect's database (async driver asyncpg)."""
        return self.url(self.name + SUFFIXES["prefect"], driver="asyncpg")

    def mlflow_url(self) -> str:
        """MLflow's ``--backend-store-uri``; the driver named (SQLAlchemy 2.1's default for postgresql:// is
        psycopg 3, which we do not install)."""
        return self.url(self.name + SUFFIXES["mlflow"], driver="psycopg2")


def parse_db(url: str) -> PgDatabase:
    """``postgresql://USER[:PASSWORD]@HOST[:PORT]/NAME`` -> PgDatabase; anything else is a ServeError (exit 2)."""
    p = urllib.parse.urlsplit(url)
    scheme = p.scheme.split("+")[0]
    if scheme not in SCHEMES:
        raise ServeError(f"--db {url!r}: expected postgresql://USER@HOST:PORT/NAME (SQLite, the default, needs no "
                         "--db)", 2)
    name = p.path.lstrip("/")
    if not p.username or not p.hostname or not name:
        raise ServeError(f"--db {_hide(url)}: give the user, the host and the database name, "
                         "postgresql://USER@HOST:PORT/NAME", 2)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ServeError(f"--db {_hide(url)}: database name {name!r}: letters, digits and _ only (the servers' "
                         f"databases are {name}_prefect and {name}_mlflow)", 2)
    try:
        port = p.port or 5432
    except ValueError as e:
        raise ServeError(f"--db {_hide(url)}: {e}", 2) from None
    return PgDatabase(urllib.parse.unquote(p.username), urllib.parse.unquote(p.password) if p.password else None,
                      p.hostname, port, name, p.query)


def _hide(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def ensure_databases(db: PgDatabase, timeout_s: float = 10.0) -> list[str]:
    """Check the server and the login; create ``NAME_prefect`` / ``NAME_mlflow`` when missing. Returns the
    names created."""
    try:
        import psycopg2
    except ImportError:
        raise ServeError("--db postgresql://... needs psycopg2 (pip install 'psycopg2-binary>=2.9,<3')", 2) from None
    kw = {"user": db.user, "host": db.host, "port": db.port, "connect_timeout": max(1, int(timeout_s))}
    if db.password is not None:
        kw["password"] = db.password
    conn = None
    for dbname in (db.name, "postgres"):     # NAME itself may not exist: it only names the two databases
        try:
            conn = psycopg2.connect(dbname=dbname, **kw)
            break
        except psycopg2.OperationalError as e:
            err = str(e).strip()
            if "does not exist" not in err:
                break
    if conn is None:
        raise ServeError(f"--db {db.shown}: cannot connect: {err}. Is PostgreSQL running there and does it "
                         f"accept this user? See docs/SERVE.md", 2)
    created = []
    try:
        conn.autocommit = True          # CREATE DATABASE cannot run inside a transaction
        with conn.cursor() as cur:
            for suffix in SUFFIXES.values():
                name = db.name + suffix
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone():
                    continue
                try:
                    cur.execute(f'CREATE DATABASE "{name}"')     # name checked by parse_db: no quoting issue
                except psycopg2.Error as e:
                    raise ServeError(f"--db {db.shown}: database {name!r} is missing and cannot be created "
                                     f"({str(e).strip()}); create it (createdb -O {db.user} {name}) or grant "
                                     f"CREATEDB to {db.user}", 2) from None
                created.append(name)
    finally:
        conn.close()
    return created


__all__ = ["PgDatabase", "parse_db", "ensure_databases"]
