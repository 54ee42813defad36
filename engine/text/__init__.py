"""Text: the tokenizer (tokenizer.json or tekken.json), chat templates and the
incremental detokenizer."""
