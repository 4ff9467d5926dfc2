"""Object-store roots that are refused, each with what to write instead."""

from __future__ import annotations

import pytest

from tasks.core.settings import RunOptions


@pytest.mark.parametrize(
    "root, why",
    [
        ("s3://AKIA:secret@bucket/x", "never from the URL"),
        ("s3://Bad_Bucket/x", "is not a bucket name"),
        ("s3://bucket/../x", "'.'/'..' segments"),
        ("gs://bucket/x", "a local directory or an s3://bucket/prefix URL"),
        ("s3://bucket/team?", "glob and query characters"),
        ("s3://bucket/x?versionId=1", "glob and query characters"),
        ("s3:/bucket/x", "a local directory or an s3://bucket/prefix URL"),
    ],
)
def test_bad_object_store_roots_are_refused_with_the_fix(root, why):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        RunOptions(artifacts_dir=root)
    assert why in str(err.value)
