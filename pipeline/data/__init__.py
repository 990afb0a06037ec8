"""The data stages' inputs: datasets (loaders, one array format) and the partition into clients."""
