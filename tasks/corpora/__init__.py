"""Corpus sources as adapters behind one protocol (:mod:`tasks.corpora.source`) and the one corpus writer."""
