"""Planning a run before it runs: architecture counts from a model config, and the memory plan built on them."""
