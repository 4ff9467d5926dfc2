"""Fetching what a stage reads from an address outside the store (the corpus's zip or text, a pretrained
tokenizer's file): the resumable download, the allow-list and redirect rule (a value handed to each download),
a fetched file's content identity, the offline fallback, the source index and the downloads gc may take."""
