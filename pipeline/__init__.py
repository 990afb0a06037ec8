"""FedCache pipeline library: pure Python/PyTorch, no Prefect or DVC imports."""
