"""What every family is built from: `PackedLinear` over the C++ GEMM (`linear`), the C++
custom ops (`layers`), the shared attention and MLP blocks (`blocks`), and the two fast
paths of the Llama layer stack (`native_stack`, `compiled`)."""
