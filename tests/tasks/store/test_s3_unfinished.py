"""A builder killed mid-upload leaves its multipart upload unfinished (no object listing shows it, S3 keeps its
parts for ever); the next builder of that version, holding its lock, aborts it and publishes. Real S3 server."""

from __future__ import annotations

from tasks.registry import open_store


def _publish(store, files: dict[str, bytes]) -> dict:
    with store.lock("corpus", "v1"):
        build = store.open_build("corpus", "v1")
        for rel, data in files.items():
            (build.out / rel).write_bytes(data)
        return build.publish(settings={"a": 1}, inputs={}, code_version="1")


def test_the_next_build_aborts_the_multipart_upload_a_killed_builder_left(s3_root):
    store = open_store(s3_root)
    left = store.files._object_key("corpus/v1") + "/b-killed/a.txt"  # under the version's key, as a builder's
    store.files._call("create_multipart_upload", Key=left)
    assert len(store.files._call("list_multipart_uploads").get("Uploads", [])) == 1
    manifest = _publish(store, {"a.txt": b"a" * 100})
    assert store.files._call("list_multipart_uploads").get("Uploads", []) == []
    assert store.files.fs.cat_file(f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}/a.txt") == b"a" * 100
