"""What acts on a trained run: text sampled from it (``attnlab sample``), its perplexity through rolling KV
caches past its block (``attnlab stream``), its heads' scores and types (``attnlab analyze``), and its
model written as a transformers dir (``attnlab export``)."""
