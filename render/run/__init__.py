"""A render run: its spec and files, which frames each shard holds, the frame encodings, the warm workers and the Ray driver side."""
