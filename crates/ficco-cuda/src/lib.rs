//! ficco-cuda: the GPU backend.
