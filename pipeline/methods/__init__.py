"""One folder per method (method.py; params.py is its params.yaml section); registry.py finds them."""
