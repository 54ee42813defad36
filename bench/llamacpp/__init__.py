"""llama.cpp compiled for this host, the benchmarks' baseline.

The llama.cpp that the installed llama-cpp-python binds (the `vendor/llama.cpp` of its
sdist, so the library and its Python bindings agree), built the way a llama.cpp user
builds it (`-march=native`), so the baseline uses every SIMD level this host has: AVX-512
and, where the OS grants the tiles, AMX. The test suite's llama-cpp-python is a portable
AVX2 build (the Makefile's llamacpp-ref), right for reading GGUF exports but slower than
llama.cpp can be on an AVX-512 host.

build.py makes the build once per version and host class under the fp8serve cache;
server.py runs its `llama-server` for `fp8serve bench serve --llama-server`; bench
generate loads its shared library into llama-cpp-python (``LLAMA_CPP_LIB_PATH``).
`fp8serve bench llamacpp` builds it and prints what it was compiled for."""
