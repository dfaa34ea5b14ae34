"""The scratch PostgreSQL database a benchmark creates on the server DATABASE_URL names (default
the local one) and drops when it is done."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from urllib.parse import urlparse

ADMIN_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class ScratchDatabase:
    name: str
    admin_url: str = ADMIN_URL

    def __post_init__(self) -> None:
        if not self.admin_url.startswith("postgres"):
            sys.exit("the benchmark needs PostgreSQL: set DATABASE_URL=postgres://...")

    @property
    def url(self) -> str:
        return urlparse(self.admin_url)._replace(path=f"/{self.name}").geturl()

    def recreate(self) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)', f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _execute(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
