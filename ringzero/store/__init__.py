"""Checkpoint store: one interface over file:// and s3:// with manifests, checksums and commit markers."""
