"""The data stages' chunk work on Dask: a local cluster per stage or an existing scheduler (``work``)."""
