"""Typed storage settings. Credentials are never part of the config: they come from the environment."""

from __future__ import annotations

from pydantic import Field, field_validator

from ringzero.strict_model import StrictModel


class S3Settings(StrictModel):
    """How to reach an S3-compatible store (MinIO, Ceph RGW, AWS, SeaweedFS).

    Credentials are read from ``RINGZERO_S3_ACCESS_KEY`` / ``RINGZERO_S3_SECRET_KEY`` (or the
    ``*_FILE`` variants pointing at mounted secret files), never from YAML.
    """

    endpoint: str = Field("127.0.0.1:9000", description="host:port of the S3 API (no scheme)")
    secure: bool = Field(False, description="use TLS")
    region: str | None = Field(None, description="region name, if the server needs one")
    cert_check: bool = Field(True, description="verify TLS certificates")
    part_size_mb: int = Field(16, ge=5, description="multipart upload part size (S3 minimum is 5 MiB)")
    max_retries: int = Field(5, ge=0, description="retries on transient errors, with exponential backoff")
    backoff_base_s: float = Field(
        0.5, gt=0, description="first retry waits about this long; each next one twice as long"
    )
    backoff_max_s: float = Field(20.0, gt=0, description="upper bound of one wait between retries")
    timeout_s: float = Field(60.0, gt=0, description="connect and read timeout of one HTTP request")

    @field_validator("endpoint")
    @classmethod
    def _no_scheme(cls, v: str) -> str:
        if "://" in v:
            raise ValueError(f"give host:port without a scheme; set secure: true for TLS (got {v!r})")
        return v


class StorageConfig(StrictModel):
    root: str = Field(
        "file://runs/store", description="checkpoint root URI: file://PATH or s3://BUCKET/PREFIX"
    )
    s3: S3Settings = S3Settings()

    @field_validator("root")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if not (v.startswith("file://") or v.startswith("s3://")):
            raise ValueError(f"must start with file:// or s3:// (got {v!r})")
        if v.startswith("s3://") and not v[len("s3://") :].split("/")[0]:
            raise ValueError(f"s3 URI needs a bucket name (got {v!r})")
        return v
