"""S3 credentials from the environment: plain variables or ``*_FILE`` variables naming mounted secret files.

The values never reach YAML, logs, reprs or error messages; ``scrub`` removes them from any text
that came from elsewhere (a server's error message, an exception's string) before it is shown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ringzero.errors import StoreError

ACCESS_KEY_ENV = "RINGZERO_S3_ACCESS_KEY"
SECRET_KEY_ENV = "RINGZERO_S3_SECRET_KEY"
_MASK = "***"
# Masking a one- or two-letter value would garble every message it touches while hiding nothing
# (real keys are far longer: S3 servers require at least 3 characters, most at least 8 for secrets).
_MIN_MASKED = 4


@dataclass(frozen=True, repr=False)
class S3Credentials:
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)

    def __repr__(self) -> str:
        return f"S3Credentials(access_key={_MASK}, secret_key={_MASK})"

    __str__ = __repr__

    def scrub(self, text: str) -> str:
        """``text`` with both values masked."""
        for secret in (self.secret_key, self.access_key):
            if len(secret) >= _MIN_MASKED:
                text = text.replace(secret, _MASK)
        return text


def credentials_from_env(env: Mapping[str, str] | None = None) -> S3Credentials:
    """Read the access and secret key from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    return S3Credentials(_read(env, ACCESS_KEY_ENV), _read(env, SECRET_KEY_ENV))


def _read(env: Mapping[str, str], name: str) -> str:
    file_var = f"{name}_FILE"
    direct, path = env.get(name), env.get(file_var)
    if direct and path:
        raise StoreError(f"both {name} and {file_var} are set; set only one")
    if direct:
        return direct
    if path:
        try:
            # Secret files mounted from Kubernetes usually end without a newline, hand-made ones with one.
            value = Path(path).read_text().strip()
        except OSError as exc:
            raise StoreError(f"{file_var} names {path!r}, which cannot be read: {exc.strerror}") from None
        if not value:
            raise StoreError(f"{file_var} names {path!r}, which is empty")
        return value
    raise StoreError(
        f"no S3 credentials: set {name} (or {file_var} to a file holding it); "
        "credentials are never read from the run config"
    )
