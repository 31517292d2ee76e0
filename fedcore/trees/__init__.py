"""Tree growing shared by every engine: parameters, memory budget, the one grower and the kernels."""
