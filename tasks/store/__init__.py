"""The artifact store: stage outputs as versioned, immutable, atomically published folders (docs/STORE.md)."""

from tasks.store.artifacts import ArtifactStore
from tasks.store.build import Build
from tasks.store.files import MANIFEST
from tasks.store.gc import Garbage
from tasks.store.roots import absolute_root, default_root
from tasks.store.s3_client import filesystem
from tasks.store.s3_urls import normal_url
from tasks.store.versions import VersionInfo, canonical_json, content_digest, version_id

__all__ = [
    "MANIFEST",
    "ArtifactStore",
    "Build",
    "Garbage",
    "VersionInfo",
    "absolute_root",
    "canonical_json",
    "content_digest",
    "default_root",
    "filesystem",
    "normal_url",
    "version_id",
]
