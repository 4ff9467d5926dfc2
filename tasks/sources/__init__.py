"""What a stage reads from an address outside the store, other than the corpus zip (whose machinery is
``tasks.wikitext``): today a pretrained tokenizer's file. Downloads, the allow-list's redirect check and the
offline fallback are the corpus's own (``tasks.sources.download``, ``tasks.sources.fallback``), reused, not
copied."""
