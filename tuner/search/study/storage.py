"""Where a study is stored: its URL (SQLite in the run directory unless ``--storage``
gives any SQLAlchemy URL), the URL's secrets kept out of every line (``redact_url``,
``redact_text``, ``foreign_message``), and the storage opened with heartbeats
(``open_storage``), past the race of two workers creating its schema at once.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, unquote, unquote_plus

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError

from tuner.errors import ConfigError
from tuner.search import optuna_store
from tuner.search.context import TuneContext
from tuner.search.optuna_store import (
    RDBStorage,
    StorageInternalError,
)

log = logging.getLogger(__name__)


HEARTBEAT_INTERVAL_S = 15

HEARTBEAT_ENV = "TUNER_HEARTBEAT_S"  # seconds between heartbeats; the grace is 4 of them

T = TypeVar("T")


def storage_url(ctx: TuneContext) -> str:
    if ctx.config.storage:
        return ctx.config.storage
    return f"sqlite:///{(ctx.run_dir / 'study.db').resolve()}"


def check_storage_url(url: str, *, what: str = "the study storage") -> None:
    """A URL SQLAlchemy would read otherwise than its user meant: ConfigError, before any
    connection. SQLAlchemy ends the password at its first ``@``, so a password holding a
    raw ``@`` sends the rest of it to the driver as the host name."""
    try:
        host = make_url(url).host or ""
    except (ArgumentError, ValueError):
        raise ConfigError(
            f"{what} {redact_url(url)!r} is not a SQLAlchemy URL; accepted: e.g. "
            "sqlite:///runs/study.db or postgresql+psycopg://user:PASSWORD@host:5432/db"
        ) from None
    if "@" in host:
        raise ConfigError(
            f"{what} {redact_url(url)!r}: the password holds an '@', which SQLAlchemy reads as "
            "the end of the password; accepted: the password percent-encoded ('@' as %40)"
        )


def open_storage(url: str) -> RDBStorage:
    """The study storage at ``url``, with heartbeats (a trial whose worker died is failed
    and retried twice); every failure to open it is a ConfigError without its secrets."""
    check_storage_url(url)

    def attempt() -> RDBStorage:
        interval = int(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_INTERVAL_S)
        return optuna_store.rdb_storage(
            url,
            heartbeat_interval_s=interval,
            grace_period_s=max(4 * interval, 2),
            max_retry=2,
            sqlite_timeout_s=30 if url.startswith("sqlite") else None,
        )

    try:
        return retry_schema_race(attempt)
    except (StorageInternalError, ImportError, ValueError) as exc:
        raise ConfigError(
            f"cannot open the study storage {redact_url(url)!r}: {foreign_message(exc, url)}; "
            "accepted: a SQLAlchemy URL such as sqlite:///runs/study.db or "
            "postgresql+psycopg://user@host/db"
        ) from None
    except Exception as exc:  # SQLAlchemy's errors: unreachable host, bad credentials
        raise ConfigError(
            f"cannot open the study storage {redact_url(url)!r}: {foreign_message(exc, url)}"
        ) from None


def retry_schema_race(attempt: Callable[[], T], tries: int = 5) -> T:
    """Workers opening a new database at once all create its tables; all but one collide
    (duplicate type, table or version row; SQLite says "table ... already exists"). Once
    one has, opening again works."""
    for i in range(tries):
        try:
            return attempt()
        except (IntegrityError, ProgrammingError, OperationalError) as exc:
            schema_race = not isinstance(exc, OperationalError) or "already exists" in str(exc)
            if not schema_race or i == tries - 1:
                raise
            log.info("the study storage's tables were being created by another worker; again")
            time.sleep(0.5 + i)
    raise AssertionError("unreachable")


REDACTED = "***"

# Query parameters that carry a secret (libpq's password and sslpassword, MySQL's passwd,
# tokens); matched by name, in any case.
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)

# As SQLAlchemy reads it, the user name ends at the first ':' and may hold an '@'; here the
# userinfo ends at the first '@' followed by a host and then '/', '?', '#' or the end (a
# password may hold '@' and '/', a host neither), so a password with a raw '@' is found whole.
_USERINFO = re.compile(r"^(?P<user>[^:/]*?)(?::(?P<password>.*?))?@(?=[\w.%\[\]:-]*(?:[/?#]|$))")

_BACKGROUND = re.compile(r"\s*\(Background on this error at: [^)]*\)")


@dataclass(frozen=True)
class _UrlParts:
    scheme: str  # "postgresql+psycopg://"
    user: str | None  # None: no userinfo
    password: str | None  # as written (percent-encoded or not)
    location: str  # host, port and database
    query: list[tuple[str, str]]  # as written

    def secret_values(self) -> list[str]:
        found = [self.password] if self.password else []
        return found + [v for k, v in self.query if v and _SECRET_PARAM.search(unquote_plus(k))]


def _url_parts(url: str) -> _UrlParts | None:
    head, sep, tail = url.partition("://")
    if not sep:
        return None
    match = _USERINFO.match(tail)
    user: str | None = None
    password: str | None = None
    if match is not None:
        user, password, tail = match["user"], match["password"], tail[match.end() :]
    location, _, query = tail.partition("?")
    params: list[tuple[str, str]] = []
    for item in query.split("&") if query else []:
        key, _, value = item.partition("=")
        params.append((key, value))
    return _UrlParts(f"{head}://", user, password, location, params)


def redact_url(url: str) -> str:
    """The URL without its secrets: the password of its userinfo (also one holding an '@')
    and every query parameter that carries one (``password``, ``sslpassword``, ...)."""
    parts = _url_parts(url)
    if parts is None:  # not a URL (a typo such as "postgresql:/u:pw@host"): mask ":...@"
        return re.sub(r"(?<=:)[^:@]*(?=@)", REDACTED, url)
    if not parts.secret_values():
        return url
    userinfo = ""
    if parts.user is not None:
        userinfo = parts.user + (f":{REDACTED}" if parts.password is not None else "") + "@"
    query = "&".join(
        f"{k}={REDACTED}" if v and _SECRET_PARAM.search(unquote_plus(k)) else f"{k}={v}"
        for k, v in parts.query
    )
    return parts.scheme + userinfo + parts.location + (f"?{query}" if parts.query else "")


def storage_location(url: str) -> str:
    """Where a storage is, for records and messages: its URL without user name and secrets."""
    parts = _url_parts(redact_url(url))
    if parts is None or parts.user is None:
        return redact_url(url)
    query = "&".join(f"{k}={v}" for k, v in parts.query)
    return parts.scheme + parts.location + (f"?{query}" if parts.query else "")


def url_secrets(url: str) -> list[str]:
    """The secrets of a storage URL in every form a message may show them: as written,
    percent-decoded and percent-encoded; longest first."""
    parts = _url_parts(url)
    forms: set[str] = set()
    for secret in parts.secret_values() if parts is not None else []:
        forms |= {secret, unquote(secret), unquote_plus(secret), quote(unquote(secret), safe="")}
    return sorted((f for f in forms if f), key=len, reverse=True)


def redact_text(text: str, url: str) -> str:
    """``text`` (a driver's or SQLAlchemy's message) with the URL redacted and its secrets
    masked wherever they appear, also the part of a password after an '@' (SQLAlchemy
    sends it to the driver as the host name, which error messages show)."""
    text = text.replace(url, redact_url(url))
    for secret in url_secrets(url):
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
        else:  # a short one only where it stands alone, not inside every word
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", REDACTED, text)
        for i, ch in enumerate(secret):
            if ch == "@":  # ...@tail@host: the driver's host name starts with "tail@"
                tail = secret[i + 1 :]
                if tail:
                    text = text.replace(f"{tail}@", f"{REDACTED}@")
    return text


def foreign_message(exc: BaseException, url: str) -> str:
    """A third-party exception as one line for the user: its type and message, without the
    storage's secrets and without SQLAlchemy's "Background on this error" link."""
    text = _BACKGROUND.sub("", str(exc))
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return redact_text(text or type(exc).__name__, url)
