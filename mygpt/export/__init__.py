"""A mygpt model and tokenizer as a Hugging Face transformers directory (docs/HF_EXPORT.md)."""
