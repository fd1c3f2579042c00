"""CUDA C++ emitters (L5): render kernels from an op and a PipelineConfig."""
